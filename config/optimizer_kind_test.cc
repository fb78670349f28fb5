#include "config/optimizer_kind.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace onebit {
namespace {

TEST(OptimizerKindTest, TableIsIndexedByKind) {
  std::set<std::string> names;
  for (size_t i = 0; i < AllOptimizerTraits().size(); ++i) {
    const OptimizerTraits& t = AllOptimizerTraits()[i];
    EXPECT_EQ(static_cast<size_t>(t.kind), i) << t.name;
    EXPECT_EQ(&Traits(t.kind), &t);
    EXPECT_TRUE(names.insert(t.name).second) << t.name;
    ASSERT_TRUE(ParseOptimizerKind(t.name).ok());
    EXPECT_EQ(*ParseOptimizerKind(t.name), t.kind);
  }
  EXPECT_EQ(names.size(), 4u);
}

TEST(OptimizerKindTest, ParsesAnyCaseAndAdamW) {
  EXPECT_EQ(*ParseOptimizerKind("onebitadam"), OptimizerKind::kOneBitAdam);
  EXPECT_EQ(*ParseOptimizerKind("ZEROONEADAM"), OptimizerKind::kZeroOneAdam);
  EXPECT_EQ(*ParseOptimizerKind("OnebitLamb"), OptimizerKind::kOneBitLamb);
  EXPECT_EQ(*ParseOptimizerKind("adam"), OptimizerKind::kAdam);
  EXPECT_EQ(*ParseOptimizerKind("AdamW"), OptimizerKind::kAdam);
  for (const char* bad : {"", "Lamb", "OneBitAdam ", "SGD"}) {
    EXPECT_EQ(ParseOptimizerKind(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(OptimizerKindTest, Traits) {
  const OptimizerTraits& adam = Traits(OptimizerKind::kAdam);
  EXPECT_FALSE(adam.compresses);
  EXPECT_FALSE(adam.one_switch);
  const OptimizerTraits& zero_one = Traits(OptimizerKind::kZeroOneAdam);
  EXPECT_TRUE(zero_one.has_local_steps);
  EXPECT_STREQ(zero_one.warmup_end_key, "var_freeze_step");
  EXPECT_STREQ(zero_one.display_name, "0/1 Adam");
  for (OptimizerKind k : {OptimizerKind::kOneBitAdam, OptimizerKind::kOneBitLamb}) {
    EXPECT_TRUE(Traits(k).compresses);
    EXPECT_TRUE(Traits(k).one_switch);
    EXPECT_FALSE(Traits(k).has_local_steps);
    EXPECT_STREQ(Traits(k).warmup_end_key, "freeze_step");
  }
  // The warmup end is a key the type takes.
  for (const OptimizerTraits& t : AllOptimizerTraits()) {
    EXPECT_NE(std::find(t.own_keys.begin(), t.own_keys.end(), t.warmup_end_key),
              t.own_keys.end())
        << t.name;
  }
}

}  // namespace
}  // namespace onebit
