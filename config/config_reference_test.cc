// The reference is the parser's own table: every documented key parses, every object's
// unknown-key error lists exactly the documented keys, and docs/config.md is the reference.
#include "config/config_reference.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/job_config.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using Kind = ConfigKeyReference::Kind;

constexpr char kRegenerate[] =
    "bazel run //coordinator:onebit-coordinator -- --config_reference > docs/config.md";

// {"a": {"b": {"c": value}}} for path "a.b.c", with `siblings` (JSON members) beside c.
std::string Nested(const std::string& path, const std::string& value,
                   const std::string& siblings = "") {
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  std::string json = absl::StrCat("{", siblings, siblings.empty() ? "" : ", ", "\"",
                                  parts.back(), "\": ", value, "}");
  for (int i = static_cast<int>(parts.size()) - 2; i >= 0; --i) {
    json = absl::StrCat("{\"", parts[i], "\": ", json, "}");
  }
  return json;
}

// The params a type requires (the scheduler's), as JSON members by name.
std::map<std::string, std::string> RequiredParams(const std::string& params_path,
                                                  const std::string& type) {
  if (params_path != "scheduler.params") return {};
  if (type == "WarmupDecayLR" || type == "WarmupCosineLR") return {{"total_num_steps", "2000"}};
  if (type == "OneCycle") return {{"cycle_min_lr", "0.0001"}, {"cycle_max_lr", "0.001"}};
  return {};
}

std::string Members(const std::map<std::string, std::string>& members) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : members) parts.push_back(absl::StrCat("\"", name, "\": ", value));
  return absl::StrJoin(parts, ", ");
}

// The configs that put `r` at `value`: one per type that takes it (typed params), else one.
// Each has what the type requires besides.
std::vector<std::string> ConfigsWith(const ConfigKeyReference& r, const std::string& value) {
  const std::string name = r.path.substr(r.section.empty() ? 0 : r.section.size() + 1);
  if (r.types.empty()) {
    if (name == "type" && value.size() > 2) {  // a typed block's type: add its required params
      const std::map<std::string, std::string> required =
          RequiredParams(r.section + ".params", value.substr(1, value.size() - 2));
      if (!required.empty()) {
        return {Nested(r.path, value, absl::StrCat("\"params\": {", Members(required), "}"))};
      }
    }
    return {Nested(r.path, value)};
  }
  const std::string block = r.section.substr(0, r.section.find('.'));
  std::vector<std::string> configs;
  for (const std::string& type : r.types) {
    std::map<std::string, std::string> params = RequiredParams(r.section, type);
    params[name] = value;
    configs.push_back(absl::StrCat("{\"", block, "\": {\"type\": \"", type, "\", \"params\": {",
                                   Members(params), "}}}"));
  }
  return configs;
}

TEST(ConfigReferenceTest, DocsConfigMdIsTheReference) {
  std::ifstream in("docs/config.md", std::ios::binary);
  ASSERT_TRUE(in) << "docs/config.md is not in the test's runfiles; create it: " << kRegenerate;
  std::stringstream text;
  text << in.rdbuf();
  const std::string expected = ConfigReferenceMarkdown();
  if (text.str() == expected) return;
  const std::vector<std::string> have = absl::StrSplit(text.str(), '\n');
  const std::vector<std::string> want = absl::StrSplit(expected, '\n');
  size_t line = 0;
  while (line < have.size() && line < want.size() && have[line] == want[line]) ++line;
  ADD_FAILURE() << "docs/config.md differs from the config reference the code prints, first at "
                << "line " << line + 1 << ":\n  docs/config.md: "
                << (line < have.size() ? have[line] : "(end of file)")
                << "\n  the code:       " << (line < want.size() ? want[line] : "(end of file)")
                << "\nRegenerate it from the workspace root:\n  " << kRegenerate;
}

TEST(ConfigReferenceTest, EveryKeyIsDocumented) {
  const std::vector<ConfigKeyReference> keys = ConfigReference();
  ASSERT_GT(keys.size(), 100u);
  for (const ConfigKeyReference& r : keys) {
    EXPECT_FALSE(r.meaning.empty()) << r.path << ": no meaning in the table";
    EXPECT_FALSE(r.type.empty()) << r.path << ": no type";
    if (r.kind == Kind::kSetting) {
      EXPECT_FALSE(r.default_value.empty()) << r.path;
    }
    if (r.kind != Kind::kRejected) {
      EXPECT_FALSE(r.example.empty()) << r.path;
    }
  }
}

TEST(ConfigReferenceTest, DefaultsAreTheDefaultConfigs) {
  std::map<std::string, std::string> defaults;
  for (const ConfigKeyReference& r : ConfigReference()) defaults[r.path] = r.default_value;
  const JobConfig c;
  EXPECT_EQ(defaults["steps"], absl::StrCat(c.steps));
  EXPECT_EQ(defaults["onebit.exchange.mode"], "\"" + c.exchange.mode + "\"");
  EXPECT_EQ(defaults["optimizer.params.freeze_step"], absl::StrCat(c.optimizer.freeze_step));
  EXPECT_EQ(defaults["onebit.workload.hidden"], "[256, 128]");
  EXPECT_EQ(defaults["optimizer.params.betas"], "[0.9, 0.999]");
  EXPECT_EQ(defaults["onebit.security.tls.mutual"], "true");
}

// Each key at its example value is accepted (for at least one of the types that take it,
// and no type calls it unknown); what it does is what the reference says.
TEST(ConfigReferenceTest, EveryDocumentedKeyParses) {
  for (const ConfigKeyReference& r : ConfigReference()) {
    if (r.kind == Kind::kObject) continue;
    if (r.kind == Kind::kRejected) {
      for (const std::string& json : ConfigsWith(r, "1")) {
        auto c = ParseJobConfig(json);
        ASSERT_FALSE(c.ok()) << json;
        EXPECT_TRUE(absl::StartsWith(c.status().message(), r.path + ": ")) << c.status();
      }
      continue;
    }
    bool accepted = false;
    for (const std::string& json : ConfigsWith(r, r.example)) {
      auto c = ParseJobConfig(json);
      if (!c.ok()) {
        EXPECT_FALSE(absl::StrContains(c.status().message(), "unknown key")) << c.status();
        EXPECT_FALSE(absl::StrContains(c.status().message(), "not a parameter of"))
            << c.status();
        continue;
      }
      accepted = true;
      if (r.kind == Kind::kNoEffect || r.kind == Kind::kUnsupported) {
        bool noticed = false;
        for (const std::string& n : c->notices) noticed |= absl::StartsWith(n, r.path + ":");
        EXPECT_TRUE(noticed) << json << " gave no notice about " << r.path << ": "
                             << absl::StrJoin(c->notices, "; ");
      }
    }
    EXPECT_TRUE(accepted) << r.path << " = " << r.example << " is not accepted";
    if (r.kind == Kind::kOnly) {
      const std::string other = r.example == "true" ? "false" : "true";
      for (const std::string& json : ConfigsWith(r, other)) {
        auto c = ParseJobConfig(json);
        ASSERT_FALSE(c.ok()) << json;
        EXPECT_TRUE(absl::StartsWith(c.status().message(), r.path + ": ")) << c.status();
      }
    }
    if (r.kind == Kind::kUnsupported) {
      auto c = ParseJobConfig(Nested(r.path, "{\"enabled\": true}"));
      ASSERT_FALSE(c.ok()) << r.path;
      EXPECT_TRUE(absl::StartsWith(c.status().message(), r.path + ": not supported by onebit"))
          << c.status();
    }
  }
}

// An unknown key in any block is an error whose list of known keys is exactly the block's
// documented keys: the parser knows no key the reference leaves out, and the reverse.
TEST(ConfigReferenceTest, UnknownKeysListTheDocumentedKeys) {
  std::map<std::string, std::set<std::string>> documented;  // section -> key names
  std::map<std::string, Kind> kinds;
  for (const ConfigKeyReference& r : ConfigReference()) {
    documented[r.section].insert(r.path.substr(r.section.empty() ? 0 : r.section.size() + 1));
    kinds[r.path] = r.kind;
  }
  for (const auto& [section, names] : documented) {
    std::string json;
    if (section == "optimizer.params") {
      json = R"({"optimizer": {"type": "OneBitAdam", "params": {"no_such_key": 1}}})";
    } else if (section == "scheduler.params") {
      json = R"({"scheduler": {"type": "WarmupLR", "params": {"no_such_key": 1}}})";
    } else if (section.empty()) {
      json = R"({"no_such_key": 1})";
    } else {
      ASSERT_EQ(kinds[section], Kind::kObject) << section;
      json = Nested(section + ".no_such_key", "1");
    }
    auto c = ParseJobConfig(json);
    ASSERT_FALSE(c.ok()) << json;
    const std::string path = section.empty() ? "no_such_key" : section + ".no_such_key";
    EXPECT_EQ(c.status().message(), absl::StrCat(path, ": unknown key (known here: ",
                                                  absl::StrJoin(names, ", "), ")"));
  }
}

// Unknown and misspelt keys, as before the table documented them.
TEST(ConfigReferenceTest, UnknownKeysAreStillErrors) {
  for (const char* json : {R"({"stepz": 3})", R"({"train_iters": 10})",
                           R"({"fp16": {"enable": true}})",
                           R"({"bf16": {"enabled": true, "loss_scale": 1}})",
                           R"({"onebit": {"exchange": {"moed": "ps"}}})",
                           R"({"optimizer": {"type": "Adam", "params": {"momentum": 0.9}}})"}) {
    auto c = ParseJobConfig(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_TRUE(absl::StrContains(c.status().message(), ": unknown key (known here: "))
        << c.status();
  }
  auto c = ParseJobConfig(R"({"optimizer": {"type": "OneBitAdam", "params": {"max_coeff": 1}}})");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "optimizer.params.max_coeff: not a parameter of OneBitAdam (OneBitLamb takes it)");
}

}  // namespace
}  // namespace onebit
