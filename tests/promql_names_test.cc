#include "tests/promql_names.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit::promql {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> Names(const std::string& expr) {
  absl::StatusOr<std::vector<std::string>> names = MetricNames(expr);
  EXPECT_TRUE(names.ok()) << names.status();
  return names.ok() ? *names : std::vector<std::string>{};
}

TEST(PromqlNamesTest, FindsTheSelectedMetricsOnly) {
  EXPECT_THAT(Names("onebit_worker_step"), ElementsAre("onebit_worker_step"));
  EXPECT_THAT(Names("sum by (part) (rate(a_sum[10s])) / sum by (part) (rate(a_count[10s]))"),
              ElementsAre("a_sum", "a_count"));
  EXPECT_THAT(Names("sum(rate(x_total{stage=\"warmup\",link=~\"inter.*\"}[5m])) without (rank)"),
              ElementsAre("x_total"));
  EXPECT_THAT(Names("histogram_quantile(0.9, sum by (le) (rate(h_bucket[1m])))"),
              ElementsAre("h_bucket"));
  EXPECT_THAT(Names("a + on(instance) group_left(shard) b offset 5m > bool 1e-3"),
              ElementsAre("a", "b"));
  EXPECT_THAT(Names("a and b or c unless d"), ElementsAre("a", "b", "c", "d"));
  EXPECT_THAT(Names("label_replace(up{job=\"x\"}, \"dst\", \"$1\", \"src\", \"(.*)\")"),
              ElementsAre("up"));
  EXPECT_THAT(Names("max_over_time(a[10m:1m]) * 100 + Inf - NaN"), ElementsAre("a"));
  EXPECT_THAT(Names("onebit:recorded:rate5m"), ElementsAre("onebit:recorded:rate5m"));
  EXPECT_THAT(Names("a{b=\"}\"} + a"), ElementsAre("a"));
  EXPECT_THAT(Names("vector(1)"), IsEmpty());
}

TEST(PromqlNamesTest, RejectsWhatDoesNotParse) {
  EXPECT_FALSE(MetricNames("a{b=\"c}").ok());
  EXPECT_FALSE(MetricNames("rate(a[5m)").ok());
  EXPECT_FALSE(MetricNames("rate(a[$__rate_interval])").ok());
  EXPECT_EQ(SubstituteGrafanaVariables("rate(a[$__rate_interval]) + b[${__interval}]", "10s"),
            "rate(a[10s]) + b[10s]");
}

TEST(PromqlNamesTest, SampleNamesAndMissingMetrics) {
  const std::set<std::string> exported = SampleNames(
      "# HELP h A histogram.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 3\n"
      "h_sum 1.5\nh_count 3\n# TYPE g gauge\ng{rank=\"0\"} 7\n# TYPE absent gauge\n");
  EXPECT_EQ(exported, (std::set<std::string>{"h_bucket", "h_sum", "h_count", "g"}));
  EXPECT_THAT(MissingMetrics({"rate(h_sum[1m]) / rate(h_count[1m])", "avg(g)"}, exported),
              IsEmpty());
  // A bare histogram name, a family with no sample, a typo: each is reported.
  const std::vector<std::string> missing =
      MissingMetrics({"h", "absent", "avg(gg)", "vector(1)", "a{"}, exported);
  ASSERT_EQ(missing.size(), 5u);
  EXPECT_THAT(missing[0], HasSubstr("h is not exported"));
  EXPECT_THAT(missing[1], HasSubstr("absent is not exported"));
  EXPECT_THAT(missing[2], HasSubstr("gg is not exported"));
  EXPECT_THAT(missing[3], HasSubstr("names no metric"));
  EXPECT_THAT(missing[4], HasSubstr("does not parse"));
}

}  // namespace
}  // namespace onebit::promql
