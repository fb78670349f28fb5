// The job config's reference, printed from the table that ParseJobConfig walks
// (config/job_config_schema.h): every key the parser takes, with its type, allowed values,
// default (read from a default JobConfig) and meaning. docs/config.md is
// ConfigReferenceMarkdown(), as `onebit-coordinator --config_reference` prints it;
// //config:config_reference_test fails when the two differ.
#ifndef ONEBIT_CONFIG_CONFIG_REFERENCE_H_
#define ONEBIT_CONFIG_CONFIG_REFERENCE_H_

#include <string>
#include <vector>

namespace onebit {

struct ConfigKeyReference {
  enum class Kind {
    kObject,       // a block of keys (listed after it, with this path as their section)
    kSetting,      // sets a value onebit uses
    kNoEffect,     // a DeepSpeed key accepted without effect, with a notice
    kOnly,         // a DeepSpeed key accepted at one value only; the other is an error
    kUnsupported,  // a DeepSpeed feature: disabled is a notice, enabled an error
    kRejected,     // always an error
  };
  std::string path;     // "onebit.exchange.mode"
  std::string section;  // the enclosing block's path; "" at the top level
  Kind kind = Kind::kSetting;
  std::string type;           // "integer", "string", "object", ...
  std::string allowed;        // "[1, 1024]", "\"cpu\", \"cuda\""; "": any value of the type
  std::string default_value;  // as JSON; "" where the key sets no field
  std::string meaning;        // one line
  // In a typed block's params (optimizer, scheduler): the types that take the key.
  std::vector<std::string> types;
  // A JSON value the parser accepts for the key (given one of `types`); "" for kRejected.
  std::string example;
  std::string alias_of;  // a block documented as the same keys as this sibling
};

// Every key, blocks before their keys, depth first in the order of the keys' names.
std::vector<ConfigKeyReference> ConfigReference();

// The reference as Markdown, grouped by block (docs/config.md).
std::string ConfigReferenceMarkdown();

}  // namespace onebit

#endif  // ONEBIT_CONFIG_CONFIG_REFERENCE_H_
