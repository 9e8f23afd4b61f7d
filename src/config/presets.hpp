// Internal: the presets/*.json files, embedded at build time (see CMakeLists.txt).
#pragma once

#include <string_view>
#include <vector>

namespace rotary::detail {

struct PresetFile {
  std::string_view name;
  std::string_view text;
};

const std::vector<PresetFile>& presets();

}  // namespace rotary::detail
