// rotary — the one exception type of the library.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace rotary {

/// Thrown at the API boundary when an argument breaks a rule. The message names the offending
/// argument, its value and the rule, e.g. "rotary_dim=130 exceeds head_dim=128".
/// Every check runs before the first write: when this is thrown, no caller memory was modified.
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(message) {}
  /// `field`: the Spec field (spec.hpp, as spec_fields() names it) or argument the message is
  /// about, so a front end can name its own option for it (the CLI's --rotary-dim for rotary_dim).
  Error(const std::string& message, std::string field) : std::invalid_argument(message), field_(std::move(field)) {}

  /// The field or argument at fault, or empty when the rule is about no single one.
  const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

}  // namespace rotary
