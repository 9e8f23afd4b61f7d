# rotary_embed_presets(<root> <output>): writes <output>, a C++ source defining
# rotary::detail::presets() (src/config/presets.hpp) with every <root>/presets/*.json embedded, so
# `rotary presets` works wherever the library is installed. Used by the library and the fuzzers.
function(rotary_embed_presets root output)
  file(GLOB preset_files CONFIGURE_DEPENDS ${root}/presets/*.json)
  set(text "// Generated from presets/*.json by cmake/EmbedPresets.cmake.\n#include \"config/presets.hpp\"\n")
  string(APPEND text "namespace rotary::detail {\nconst std::vector<PresetFile>& presets() {\n")
  string(APPEND text "  static const std::vector<PresetFile> files = {\n")
  foreach(preset ${preset_files})
    get_filename_component(name ${preset} NAME)
    string(REGEX REPLACE "\\.json$" "" name ${name})
    file(READ ${preset} json)
    string(APPEND text "    {\"${name}\", R\"rotary_preset(${json})rotary_preset\"},\n")
  endforeach()
  string(APPEND text "  };\n  return files;\n}\n}  // namespace rotary::detail\n")
  file(CONFIGURE OUTPUT ${output} CONTENT "${text}" @ONLY)
endfunction()
