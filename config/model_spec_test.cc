// Parameter layouts and counts from the config alone.
#include "config/model_spec.h"

#include <vector>

#include "gtest/gtest.h"

namespace onebit {
namespace {

TEST(MlpLayoutTest, OffsetsAndCount) {
  auto layout = MlpLayout::Create({784, 256, 128, 10});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->num_layers(), 3);
  EXPECT_EQ(layout->num_parameters(), 784u * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(layout->weights_offset(0), 0u);
  EXPECT_EQ(layout->bias_offset(0), 784u * 256);
  EXPECT_EQ(layout->weights_offset(1), 784u * 256 + 256);
  EXPECT_EQ(layout->max_width(), 784);
  EXPECT_FALSE(MlpLayout::Create({784}).ok());
  EXPECT_FALSE(MlpLayout::Create({784, 0, 10}).ok());
  auto fashion = FashionMnistLayout({128});
  ASSERT_TRUE(fashion.ok());
  EXPECT_EQ(fashion->sizes(), (std::vector<int>{784, 128, 10}));
  // Weights, then bias, of each layer.
  EXPECT_EQ(fashion->tensor_offsets(),
            (std::vector<size_t>{0, 784 * 128, 784 * 128 + 128, 784 * 128 + 128 + 128 * 10,
                                 fashion->num_parameters()}));
}

TEST(WorkloadParameterCountTest, EachWorkloadAndUnknownOnes) {
  WorkloadConfig config;
  config.type = "fashion_mnist";
  config.hidden = {256, 128};
  EXPECT_EQ(*WorkloadParameterCount(config), 784u * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  config.hidden = {0};
  EXPECT_FALSE(WorkloadParameterCount(config).ok());
  config.type = "synthetic";
  config.parameters = 12345;
  EXPECT_EQ(*WorkloadParameterCount(config), 12345u);
  config.type = "imagenet";
  EXPECT_FALSE(WorkloadParameterCount(config).ok());
}

}  // namespace
}  // namespace onebit
