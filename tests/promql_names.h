// What the dashboard test needs to check PromQL queries against real /metrics: the metric
// names a query selects, the sample names an exposition carries, and which names of a set
// of queries are not exported.
#ifndef ONEBIT_TESTS_PROMQL_NAMES_H_
#define ONEBIT_TESTS_PROMQL_NAMES_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace onebit::promql {

// Grafana's interval variables ($__rate_interval, $__interval, $__range, and the ${...}
// spellings) replaced by `interval` ("10s"), as Grafana does before it sends a query.
std::string SubstituteGrafanaVariables(absl::string_view expr, absl::string_view interval);

// The metric names `expr` selects, in order of appearance (duplicates kept once): string
// literals, label matchers {...}, ranges [...], numbers and durations, function and
// aggregation names (an identifier followed by "("), the label lists of by / without /
// on / ignoring / group_left / group_right, and keywords (and, or, unless, bool, offset,
// inf, nan) are not names. INVALID_ARGUMENT for an unterminated string, brace or bracket,
// or a Grafana variable left in.
absl::StatusOr<std::vector<std::string>> MetricNames(absl::string_view expr);

// The sample names of a Prometheus text exposition: the name before "{" or " " on each
// line that is not a comment (so a histogram gives name_bucket, name_sum, name_count).
std::set<std::string> SampleNames(absl::string_view exposition);

// One line per metric name that a query of `exprs` selects and `exported` lacks (with the
// query), or per query that does not parse. Empty: every query names exported metrics.
std::vector<std::string> MissingMetrics(const std::vector<std::string>& exprs,
                                        const std::set<std::string>& exported);

}  // namespace onebit::promql

#endif  // ONEBIT_TESTS_PROMQL_NAMES_H_
