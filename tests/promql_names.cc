#include "tests/promql_names.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace onebit::promql {
namespace {

bool IdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }
bool IdentChar(char c) { return IdentStart(c) || std::isdigit(static_cast<unsigned char>(c)); }

// Skips a string literal starting at expr[i] (a quote); returns the index past it, or
// npos when it does not end.
size_t SkipString(absl::string_view expr, size_t i) {
  const char quote = expr[i];
  for (size_t j = i + 1; j < expr.size(); ++j) {
    if (quote != '`' && expr[j] == '\\') {
      ++j;
    } else if (expr[j] == quote) {
      return j + 1;
    }
  }
  return absl::string_view::npos;
}

// Skips a group opened at expr[i] ('{', '[' or '(') up to its matching close, strings
// inside included; npos when it does not close.
size_t SkipGroup(absl::string_view expr, size_t i) {
  const char open = expr[i];
  const char close = open == '{' ? '}' : open == '[' ? ']' : ')';
  int depth = 0;
  for (size_t j = i; j < expr.size(); ++j) {
    const char c = expr[j];
    if (c == '"' || c == '\'' || c == '`') {
      j = SkipString(expr, j);
      if (j == absl::string_view::npos) return j;
      --j;
    } else if (c == open) {
      ++depth;
    } else if (c == close && --depth == 0) {
      return j + 1;
    }
  }
  return absl::string_view::npos;
}

size_t SkipSpaces(absl::string_view expr, size_t i) {
  while (i < expr.size() && std::isspace(static_cast<unsigned char>(expr[i]))) ++i;
  return i;
}

bool IsKeyword(const std::string& word) {
  static const char* const kKeywords[] = {"and", "or",  "unless", "bool", "offset",
                                          "inf", "nan", "start",  "end"};
  std::string lower = word;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return std::find(std::begin(kKeywords), std::end(kKeywords), lower) != std::end(kKeywords);
}

bool TakesLabelList(const std::string& word) {
  return word == "by" || word == "without" || word == "on" || word == "ignoring" ||
         word == "group_left" || word == "group_right";
}

}  // namespace

std::string SubstituteGrafanaVariables(absl::string_view expr, absl::string_view interval) {
  std::string out(expr);
  for (const char* name : {"__rate_interval", "__interval", "__range"}) {
    for (const std::string& spelling : {absl::StrCat("${", name, "}"), absl::StrCat("$", name)}) {
      size_t at;
      while ((at = out.find(spelling)) != std::string::npos) {
        out.replace(at, spelling.size(), std::string(interval));
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> MetricNames(absl::string_view expr) {
  // A Grafana variable anywhere outside a string literal (ranges included).
  for (size_t i = 0; i < expr.size(); ++i) {
    if (expr[i] == '"' || expr[i] == '\'' || expr[i] == '`') {
      i = SkipString(expr, i);
      if (i == absl::string_view::npos) break;  // reported below
      --i;
    } else if (expr[i] == '$') {
      return absl::InvalidArgumentError(
          absl::StrCat("a Grafana variable is left in: ", expr.substr(i)));
    }
  }
  std::vector<std::string> names;
  size_t i = 0;
  while (i < expr.size()) {
    const char c = expr[i];
    if (c == '"' || c == '\'' || c == '`' || c == '{' || c == '[') {
      const size_t end = (c == '{' || c == '[') ? SkipGroup(expr, i) : SkipString(expr, i);
      if (end == absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("unterminated ", std::string(1, c),
                                                       " at offset ", i, " of ", expr));
      }
      i = end;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      // A number or a duration (5m, 1e-3, 0x1f, 1h30m): digits and what sticks to them.
      while (i < expr.size() && (IdentChar(expr[i]) || expr[i] == '.')) ++i;
      continue;
    }
    if (!IdentStart(c)) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < expr.size() && IdentChar(expr[end])) ++end;
    const std::string word(expr.substr(i, end - i));
    const size_t next = SkipSpaces(expr, end);
    // A call, or an aggregation written "sum by (l) (...)" / "sum without (l) (...)".
    const bool call = (next < expr.size() && expr[next] == '(') ||
                      expr.substr(next, 3) == "by " || expr.substr(next, 3) == "by(" ||
                      expr.substr(next, 8) == "without " || expr.substr(next, 8) == "without(";
    if (TakesLabelList(word)) {
      i = end;
      if (call) {
        i = SkipGroup(expr, next);
        if (i == absl::string_view::npos) {
          return absl::InvalidArgumentError(absl::StrCat("unclosed label list after ", word));
        }
      }
      continue;
    }
    i = end;
    if (call || IsKeyword(word)) continue;  // a function, an aggregation, an operator
    if (std::find(names.begin(), names.end(), word) == names.end()) names.push_back(word);
  }
  return names;
}

std::set<std::string> SampleNames(absl::string_view exposition) {
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t end = line.find_first_of("{ ");
    names.insert(std::string(line.substr(0, end)));
  }
  return names;
}

std::vector<std::string> MissingMetrics(const std::vector<std::string>& exprs,
                                        const std::set<std::string>& exported) {
  std::vector<std::string> missing;
  for (const std::string& expr : exprs) {
    absl::StatusOr<std::vector<std::string>> names = MetricNames(expr);
    if (!names.ok()) {
      missing.push_back(absl::StrCat("query does not parse (", names.status().message(),
                                     "): ", expr));
      continue;
    }
    if (names->empty()) missing.push_back(absl::StrCat("query names no metric: ", expr));
    for (const std::string& name : *names) {
      if (exported.count(name) == 0) {
        missing.push_back(absl::StrCat(name, " is not exported by any process (in: ", expr, ")"));
      }
    }
  }
  return missing;
}

}  // namespace onebit::promql
