// rotary — the one exception type of the library.
#pragma once

#include <stdexcept>
#include <string>

namespace rotary {

/// Thrown at the API boundary when an argument breaks a rule. The message names the offending
/// argument, its value and the rule, e.g. "rotary_dim=130 exceeds head_dim=128".
/// Every check runs before the first write: when this is thrown, no caller memory was modified.
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(message) {}
};

}  // namespace rotary
