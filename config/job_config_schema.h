// The job config's keys as one table that is both the parser (ParseJobConfig walks it) and
// the reference (config_reference.h prints it): a key cannot be parsed without being
// documented, nor documented without being parsed. Internal to //config:job_config.
//
// Each Key pairs a handler (validate the JSON value at a path, store it in a JobConfig
// field) with what the reference says: the type and the allowed values come from the
// handler's constructor, the default is read from the field the handler writes (the table
// is built over a default JobConfig when the reference is printed), the meaning is a line
// written next to the key in the table.
#ifndef ONEBIT_CONFIG_JOB_CONFIG_SCHEMA_H_
#define ONEBIT_CONFIG_JOB_CONFIG_SCHEMA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/json_string.h"
#include "config/config_reference.h"
#include "config/job_config.h"
#include "google/protobuf/struct.pb.h"

namespace onebit {
namespace config_schema {

using Value = google::protobuf::Value;
// Validates the value found at `path` and stores it.
using Handler = std::function<absl::Status(const Value& v, const std::string& path)>;
using Notices = std::vector<std::string>;

struct Key;
using Keys = std::map<std::string, Key>;

// What the parser does with a key: the reference's kinds (config_reference.h), of which a
// key of the table is never kObject (a block is a kSetting with keys).
using KeyKind = ConfigKeyReference::Kind;

struct Key {
  Handler parse;
  KeyKind kind = KeyKind::kSetting;
  std::string type;     // "integer", "number", "string", "boolean", "object", ...
  std::string allowed;  // "[1, 1024]", "`cpu`, `cuda`"; "": any value of the type
  // The field's value as JSON, read when called; null: the key writes no field.
  std::function<std::string()> value;
  // A value the key accepts (the reference's tests parse it), as JSON.
  std::function<std::string()> example;
  // One line: what the key means; for DeepSpeed keys without effect, what onebit does.
  std::string meaning;
  std::shared_ptr<const Keys> keys;  // an object's keys; null for a leaf
  // In a typed block's params: the types that take the key (every type: all of them).
  std::vector<std::string> types;
  std::string alias_of;  // documented as the same keys as this sibling (not expanded)

  Key Means(std::string m) && {
    meaning = std::move(m);
    return std::move(*this);
  }
  // For a key whose default is not a field's value (a derived one).
  Key DefaultIs(std::string text) && {
    value = [text] { return text; };
    return std::move(*this);
  }
};

// The state of one parse besides the JobConfig: keys whose absence means something, and
// values that are checked once the whole block has been read.
struct ParseState {
  JobConfig* config = nullptr;
  int64_t train_batch = 0, accumulation = 1;
  bool train_batch_given = false, micro_given = false, accumulation_given = false;
  bool workers_given = false, device_given = false, backend_given = false;
  // scheduler
  bool scheduler_type_given = false, total_given = false, min_lr_given = false,
       max_lr_given = false;
  int64_t last_batch_iteration = -1;
  bool checkpoint_every_given = false;  // onebit.checkpoint.every_steps
  bool shard_state_given = false;       // onebit.exchange.shard_state
  bool warmup_over_given = false;       // onebit.exchange.warmup_over
  int zero_stage = -1;                  // zero_optimization.stage; -1: no block
};

// The top level's keys, writing into state->config (and its notices) and *state. The
// result refers to both: it must not outlive them.
Keys JobConfigKeys(ParseState* state);

// The checks that span several keys (the batch rule, the exchange's modes, TLS), once
// JobConfigKeys(&state) has parsed every key; fills in what they derive (notices say so).
// job_config_checks.cc.
absl::Status CheckJobConfig(const ParseState& state);

// Visits the keys of an object; unknown keys are errors that list the known ones.
absl::Status Object(const Value& v, const std::string& path, const Keys& keys);

// INVALID_ARGUMENT "path: message".
absl::Status Bad(const std::string& path, absl::string_view message);
// "path.key", or "key" at the top level.
std::string Join(const std::string& path, const std::string& key);
// JSON string literals (common/json_string.h).
using ::onebit::JsonEscaped;
using ::onebit::JsonString;

}  // namespace config_schema
}  // namespace onebit

#endif  // ONEBIT_CONFIG_JOB_CONFIG_SCHEMA_H_
