// The schedule registry (src/schedules/registry.hpp): each entry is whole, and reaches every front
// end — make_schedule, to_string and parse_schedule, the config reader under each of its rope_type
// names, the CLI's --schedule, the C ABI's rotary_schedule_type, and the table of schedules in
// spec.hpp's docs (Python's Rope(schedule=...): python/tests/test_schedule_registry.py). A new
// schedule that misses one of the places spec_fields.hpp lists fails here.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "rotary/hf_config.hpp"
#include "rotary/rotary.h"
#include "rotary/schedule.hpp"
#include "rotary/spec.hpp"
#include "rotary/spec_fields.hpp"
#include "schedules/registry.hpp"
#include "support/oracle.hpp"
#ifdef ROTARY_TEST_CLI
#include "cli.hpp"
#endif

namespace rotary {
namespace {

using detail::kScheduleEntries;
using detail::ScheduleEntry;

constexpr int64_t kHeadDim = 64;  // 32 pairs
constexpr size_t kPairs = kHeadDim / 2;

// A valid value of each field a schedule may require, on a head of kHeadDim. A new schedule's new
// field needs a value here (the tests say which).
const std::map<std::string_view, FieldValue>& sample_values() {
  static const std::map<std::string_view, FieldValue> values = {
      {"factor", 4.0},
      {"original_max_position", int64_t{4096}},
      {"max_position", int64_t{16384}},
      {"low_freq_factor", 1.0},
      {"high_freq_factor", 4.0},
      {"short_factor", std::vector<double>(kPairs, 1.5)},
      {"long_factor", std::vector<double>(kPairs, 3.0)},
      {"max_length", int64_t{4096}},
      {"partial_rotary_factor", 0.5},
  };
  return values;
}

// The fields that make a Spec of this schedule valid: the first of each required group, and the
// optional fields without which make_schedule refuses it (longrope's factor lists).
std::vector<std::string_view> fields_to_set(const ScheduleInfo& info) {
  std::vector<std::string_view> names;
  for (const auto& any_of : info.required) names.push_back(any_of.front());
  for (std::string_view name : info.optional) {
    if (name == "short_factor" || name == "long_factor") names.push_back(name);
  }
  return names;
}

// The identifiers in `text` (runs of a-z, 0-9 and _), in order.
std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  std::string word;
  for (const char c : std::string(text) + " ") {
    if (std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_') {
      word.push_back(c);
    } else if (!word.empty()) {
      out.push_back(std::move(word));
      word.clear();
    }
  }
  return out;
}

Spec sample_spec(const ScheduleInfo& info) {
  Spec spec{.head_dim = kHeadDim, .schedule = info.type};
  for (std::string_view name : fields_to_set(info)) {
    const auto value = sample_values().find(name);
    if (value == sample_values().end()) {
      ADD_FAILURE() << "schedule " << info.name << " needs " << name << ": give it a value in sample_values()";
      continue;
    }
    set_field(spec, name, value->second);
  }
  return spec;
}

TEST(ScheduleRegistry, OneWholeEntryPerScheduleTypeInEnumOrder) {
  ASSERT_EQ(kScheduleEntries.size(), static_cast<size_t>(ScheduleType::last) + 1);
  std::set<std::string_view> names, rope_types;
  for (size_t i = 0; i < kScheduleEntries.size(); ++i) {
    const ScheduleEntry& entry = kScheduleEntries[i]();
    const auto type = static_cast<ScheduleType>(i);
    SCOPED_TRACE(entry.info.name);
    EXPECT_EQ(entry.info.type, type) << "kScheduleEntries[" << i << "] is not ScheduleType(" << i << ")'s entry";
    EXPECT_EQ(&detail::schedule_entry(type), &entry);
    EXPECT_TRUE(names.insert(entry.info.name).second) << "name twice";
    EXPECT_FALSE(entry.info.doc.empty());
    EXPECT_NE(entry.derive, nullptr);
    EXPECT_NE(entry.hf_float32, nullptr);
    for (std::string_view rope_type : entry.rope_types) {
      EXPECT_TRUE(rope_types.insert(rope_type).second) << "rope_type " << rope_type << " names two schedules";
      EXPECT_EQ(detail::find_rope_type(rope_type), &entry);
    }
    if (entry.rope_types.empty()) {
      EXPECT_EQ(entry.read_config, nullptr) << "reads a config, but no rope_type names it";
      EXPECT_TRUE(entry.rope_keys.empty());
    }
  }
  EXPECT_EQ(detail::find_rope_type("nope"), nullptr);
  EXPECT_ROTARY_ERROR(detail::schedule_entry(static_cast<ScheduleType>(-1)), "schedule=-1 is not a schedule type");
}

TEST(ScheduleRegistry, EveryEntryReachesTheCppApi) {
  ASSERT_EQ(schedules().size(), kScheduleEntries.size());
  for (size_t i = 0; i < kScheduleEntries.size(); ++i) {
    const ScheduleInfo& info = kScheduleEntries[i]().info;
    SCOPED_TRACE(info.name);
    EXPECT_EQ(schedules()[i].name, info.name);
    EXPECT_EQ(to_string(info.type), info.name);
    EXPECT_EQ(parse_schedule(info.name), info.type);
    Spec by_name{.head_dim = kHeadDim};
    set_field(by_name, "schedule", std::string(info.name));
    EXPECT_EQ(by_name.schedule, info.type);
    const Schedule schedule = make_schedule(sample_spec(info));
    EXPECT_EQ(schedule.type, info.type);
    EXPECT_EQ(schedule.inv_freq.size(), kPairs);
    EXPECT_EQ(schedule.inv_freq_hf32.size(), kPairs);
  }
  EXPECT_EQ(to_string(static_cast<ScheduleType>(kScheduleEntries.size())), "?");
}

// A llama config whose rope dict names `rope_type` and holds every key the schedule reads.
std::string config_naming(std::string_view rope_type, const ScheduleEntry& entry,
                          const nlohmann::json& extra = nlohmann::json::object()) {
  const std::map<std::string_view, nlohmann::json> values = {
      {"factor", 4.0},           {"original_max_position_embeddings", 4096},
      {"attention_factor", 1.0}, {"beta_fast", 32.0},
      {"beta_slow", 1.0},        {"mscale", 1.0},
      {"mscale_all_dim", 1.0},   {"truncate", true},
      {"low_freq_factor", 1.0},  {"high_freq_factor", 4.0},
      {"short_factor", std::vector<double>(kPairs, 1.5)},
      {"long_factor", std::vector<double>(kPairs, 3.0)},
  };
  nlohmann::json rope = {{"rope_type", rope_type}};
  for (std::string_view key : entry.rope_keys) {
    const auto value = values.find(key);
    if (value == values.end()) {
      ADD_FAILURE() << "rope_type " << rope_type << " reads " << key << ": give it a value in config_naming()";
      continue;
    }
    rope[std::string(key)] = value->second;
  }
  rope.update(extra);
  const nlohmann::json config = {{"model_type", "llama"},
                                 {"hidden_size", kHeadDim * 8},
                                 {"num_attention_heads", 8},
                                 {"max_position_embeddings", 16384},
                                 {"rope_scaling", rope}};
  return config.dump();
}

bool notes_contain(const ModelRope& model, std::string_view text) {
  for (const std::string& note : model.notes) {
    if (note.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(ScheduleRegistry, EveryRopeTypeReachesTheConfigReader) {
  // The error for an unknown rope_type lists every rope_type the registry reads.
  std::string error;
  try {
    read_hf_config(config_naming("nope", kScheduleEntries[0]()));
  } catch (const Error& e) {
    error = e.what();
  }
  const std::vector<std::string> listed = words(error.substr(error.rfind('(') + 1));
  const std::set<std::string> supported(listed.begin(), listed.end());
  for (const auto entry : kScheduleEntries) {
    const ScheduleEntry& e = entry();
    SCOPED_TRACE(e.info.name);
    for (std::string_view rope_type : e.rope_types) {
      EXPECT_TRUE(supported.contains(std::string(rope_type))) << error;
      const ModelRope model = read_hf_config(config_naming(rope_type, e));
      EXPECT_EQ(model.spec.schedule, e.info.type) << rope_type;
      EXPECT_FALSE(notes_contain(model, "is not a key of rope_type")) << rope_type << " ignores a key of rope_keys";
      EXPECT_NO_THROW(make_schedule(model.spec)) << rope_type;
      // A key the schedule does not read is named, with the schedule's own rope_type.
      const ModelRope stray = read_hf_config(config_naming(rope_type, e, {{"frobnicate", 1}}));
      EXPECT_TRUE(notes_contain(stray, fmt::format("rope_scaling.frobnicate is not a key of rope_type {}: ignored",
                                                   e.rope_types.front())));
    }
  }
}

#ifdef ROTARY_TEST_CLI
TEST(ScheduleRegistry, EveryEntryReachesTheCli) {
  for (const auto entry : kScheduleEntries) {
    const ScheduleInfo& info = entry().info;
    SCOPED_TRACE(info.name);
    std::vector<std::string> args = {"rotary", "info", "--head-dim", std::to_string(kHeadDim), "--schedule",
                                     std::string(info.name), "--json"};
    for (std::string_view name : fields_to_set(info)) {
      const auto value = sample_values().find(name);
      ASSERT_NE(value, sample_values().end()) << name;
      args.push_back(cli_option(*find_spec_field(name)));
      std::visit([&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::vector<double>> || std::is_same_v<T, std::vector<int64_t>>) {
          args.push_back(fmt::format("{}", fmt::join(v, ",")));
        } else if constexpr (!std::is_same_v<T, bool>) {
          args.push_back(fmt::format("{}", v));
        }
      }, value->second);
    }
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    std::ostringstream out, err;
    ASSERT_EQ(cli::run(static_cast<int>(argv.size()), argv.data(), out, err), 0) << err.str();
    const auto j = nlohmann::json::parse(out.str());
    EXPECT_EQ(j["schedule"], std::string(info.name));
    EXPECT_EQ(j["inv_freq"].get<std::vector<double>>(), make_schedule(sample_spec(info)).inv_freq);
  }
}
#endif

// The C enum's values are ScheduleType's (c_api.cpp checks the count against the registry when it
// compiles). A new schedule adds its line here.
static_assert(ROTARY_SCHEDULE_DEFAULT == static_cast<int>(ScheduleType::default_));
static_assert(ROTARY_SCHEDULE_LINEAR == static_cast<int>(ScheduleType::linear));
static_assert(ROTARY_SCHEDULE_NTK == static_cast<int>(ScheduleType::ntk));
static_assert(ROTARY_SCHEDULE_DYNAMIC == static_cast<int>(ScheduleType::dynamic));
static_assert(ROTARY_SCHEDULE_YARN == static_cast<int>(ScheduleType::yarn));
static_assert(ROTARY_SCHEDULE_LLAMA3 == static_cast<int>(ScheduleType::llama3));
static_assert(ROTARY_SCHEDULE_LONGROPE == static_cast<int>(ScheduleType::longrope));
static_assert(ROTARY_SCHEDULE_MONOTONE == static_cast<int>(ScheduleType::monotone));
static_assert(ROTARY_SCHEDULE_PROPORTIONAL == static_cast<int>(ScheduleType::proportional));
static_assert(ROTARY_SCHEDULE_LAST == static_cast<int>(ScheduleType::last));

TEST(ScheduleRegistry, EveryEntryReachesTheCAbi) {
  const std::vector<double> short_factor(kPairs, 1.5), long_factor(kPairs, 3.0);
  // The rotary_spec (or rotary_spec_ext) member of each field a schedule may require.
  const std::map<std::string_view, std::function<void(rotary_spec&, rotary_spec_ext&)>> setters = {
      {"factor", [](rotary_spec& c, rotary_spec_ext&) { c.factor = 4.0; }},
      {"original_max_position", [](rotary_spec& c, rotary_spec_ext&) { c.original_max_position = 4096; }},
      {"low_freq_factor", [](rotary_spec& c, rotary_spec_ext&) { c.low_freq_factor = 1.0; }},
      {"high_freq_factor", [](rotary_spec& c, rotary_spec_ext&) { c.high_freq_factor = 4.0; }},
      {"short_factor", [&](rotary_spec& c, rotary_spec_ext&) {
         c.short_factor = short_factor.data();
         c.short_factor_count = static_cast<int64_t>(kPairs);
       }},
      {"long_factor", [&](rotary_spec& c, rotary_spec_ext&) {
         c.long_factor = long_factor.data();
         c.long_factor_count = static_cast<int64_t>(kPairs);
       }},
      {"max_length", [](rotary_spec& c, rotary_spec_ext&) { c.max_length = 4096; }},
      {"partial_rotary_factor", [](rotary_spec&, rotary_spec_ext& e) { e.partial_rotary_factor = 0.5; }},
  };
  for (const auto entry : kScheduleEntries) {
    const ScheduleInfo& info = entry().info;
    SCOPED_TRACE(info.name);
    rotary_spec c{};
    rotary_spec_ext ext{};
    c.head_dim = kHeadDim;
    c.schedule = static_cast<rotary_schedule_type>(info.type);
    for (std::string_view name : fields_to_set(info)) {
      const auto setter = setters.find(name);
      ASSERT_NE(setter, setters.end()) << "the C ABI has no member for " << name;
      setter->second(c, ext);
    }
    rotary_schedule* schedule = nullptr;
    ASSERT_EQ(rotary_schedule_from_spec_ext(&c, &ext, -1, &schedule), ROTARY_OK) << rotary_last_error();
    EXPECT_EQ(rotary_schedule_type_of(schedule), static_cast<int>(info.type));
    const Schedule expected = make_schedule(sample_spec(info));
    EXPECT_EQ(std::vector<double>(rotary_schedule_inv_freq(schedule), rotary_schedule_inv_freq(schedule) + kPairs),
              expected.inv_freq);
    rotary_schedule_free(schedule);
  }
  // Past the last value: the error names the first and the last.
  rotary_spec c{};
  c.head_dim = kHeadDim;
  const int past = ROTARY_SCHEDULE_LAST + 1;
  std::memcpy(&c.schedule, &past, sizeof past);
  rotary_schedule* schedule = nullptr;
  EXPECT_EQ(rotary_schedule_from_spec(&c, -1, &schedule), ROTARY_ERROR_INVALID_ARGUMENT);
  std::string last(to_string(ScheduleType::last));
  for (char& ch : last) ch = static_cast<char>(std::toupper(ch));
  EXPECT_EQ(std::string(rotary_last_error()),
            fmt::format("spec.schedule={} is not a rotary_schedule_type (ROTARY_SCHEDULE_DEFAULT=0 .. "
                        "ROTARY_SCHEDULE_{}={})",
                        past, last, ROTARY_SCHEDULE_LAST));
}

// spec.hpp's table of which schedule takes which fields, above struct Spec: a row per schedule
// (continued on rows with an empty first cell), naming exactly the fields of its entry.
TEST(ScheduleRegistry, TheTableInSpecHppListsEverySchedule) {
  std::ifstream in(ROTARY_SOURCE_DIR "/include/rotary/spec.hpp");
  ASSERT_TRUE(in) << "cannot read spec.hpp";
  std::map<std::string, std::set<std::string>> rows;
  std::string line, current;
  while (std::getline(in, line)) {
    // "/// | yarn     | factor, original_max_position|max_position | beta_fast, ... |": cells part at
    // " | " (a '|' inside a cell, between alternatives, has no spaces).
    if (!line.starts_with("/// |") || !line.ends_with("|") || line.starts_with("/// |--")) continue;
    const std::string cells = line.substr(5, line.size() - 6);
    const size_t first_end = cells.find(" | ");
    if (first_end == std::string::npos) continue;
    const std::vector<std::string> name = words(cells.substr(0, first_end));
    if (!name.empty()) current = name.front();
    if (current == "schedule") continue;  // the heading
    std::set<std::string>& named = rows[current];
    for (std::string& field : words(cells.substr(first_end))) named.insert(std::move(field));
  }
  for (const ScheduleInfo& info : schedules()) {
    std::set<std::string> named(info.optional.begin(), info.optional.end());
    for (const auto& any_of : info.required) named.insert(any_of.begin(), any_of.end());
    ASSERT_TRUE(rows.contains(std::string(info.name))) << "spec.hpp's table has no row for " << info.name;
    EXPECT_EQ(rows[std::string(info.name)], named) << "spec.hpp's row for " << info.name;
  }
  EXPECT_EQ(rows.size(), schedules().size());
}

}  // namespace
}  // namespace rotary
