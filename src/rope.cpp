#include "rotary/rope.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <utility>

#include "apply_internal.hpp"
#include "math/hd.hpp"
#include "rotary/error.hpp"

namespace rotary {

struct Rope::Caches {
  std::mutex mutex;  // guards the two pointers; a published Table is immutable
  std::shared_ptr<const Table> exact, hf_float32;

  std::shared_ptr<const Table>& slot(AngleMode mode) { return mode == AngleMode::exact ? exact : hf_float32; }
};

Rope::Rope(const Spec& spec, std::optional<int64_t> seq_len) : Rope(make_schedule(spec, seq_len)) {}
Rope::Rope(Schedule schedule) : schedule_(std::move(schedule)), caches_(std::make_unique<Caches>()) {}
Rope::Rope(Rope&&) noexcept = default;
Rope& Rope::operator=(Rope&&) noexcept = default;
Rope::~Rope() = default;

int64_t Rope::max_cached_rows() const {
  return cache_bytes / std::max<int64_t>(1, 2 * schedule_.pairs() * static_cast<int64_t>(sizeof(float)));
}

std::shared_ptr<const Table> Rope::cached(int64_t rows, AngleMode mode) const {
  if (rows <= 0 || rows > max_cached_rows()) return nullptr;
  const std::unique_lock lock(caches_->mutex, std::try_to_lock);
  if (!lock.owns_lock()) return nullptr;
  const std::shared_ptr<const Table>& slot = caches_->slot(mode);
  return slot && slot->rows() >= rows ? slot : nullptr;
}

std::shared_ptr<const Table> Rope::table(int64_t rows, AngleMode mode) const {
  const int64_t max_rows = max_cached_rows();
  if (rows <= 0 || rows > max_rows) return nullptr;
  if (mode != AngleMode::exact && mode != AngleMode::hf_float32) {
    throw Error("mode=" + std::to_string(static_cast<int>(mode)) + " is not exact or hf_float32");
  }
  const std::lock_guard lock(caches_->mutex);
  std::shared_ptr<const Table>& slot = caches_->slot(mode);
  if (!slot || slot->rows() < rows) {
    int64_t grown = std::max<int64_t>(4096, slot ? slot->rows() : 0);
    while (grown < rows) grown *= 2;
    grown = std::min(grown, max_rows);
    slot = std::make_shared<const Table>(Table::range(schedule_, 0, grown, mode));  // calls hold the old one
  }
  return slot;
}

namespace {

// Out of line and cold, so that the folded copy's frame stays off Rope::apply's path.
[[gnu::noinline, gnu::cold]] void apply_with_old_names(const Rope& rope, const ApplyArgs& args) {
  rope.apply(detail::folded(args));
}

}  // namespace

void Rope::apply(const ApplyArgs& args) const {
  if (detail::uses_old_names(args)) [[unlikely]] {
    apply_with_old_names(*this, args);
    return;
  }
  if (args.table != nullptr) {
    throw Error("table is set, but Rope::apply takes its angles from the Rope's own tables (leave table null, "
                "or call rotary::apply with the table)");
  }
  const auto extent = detail::validate_extent(schedule_, args);
  // A table serves whole positions of 16- and 32-bit tensors (f64 ones turn by double cos and sin,
  // which a float32 table does not hold); undo divides the attention factor out of exact angles,
  // which a table (holding cos and sin times the factor) cannot.
  const bool table_serves = extent && args.caller_angles == nullptr && !args.positions.is_fractional() &&
                            args.q.dtype != DType::f64 && !(args.undo && schedule_.attention_factor != 1.0);
  std::shared_ptr<const Table> table;
  if (table_serves) {
    const auto rows = static_cast<int64_t>(extent->second) + 1;
    const AngleMode mode = numerics_of(args);
    table = cached(rows, mode);
    if (!table) table = this->table(rows, mode);
  }
  if (!table) {
    detail::apply_validated(schedule_, args);
    return;
  }
  ROTARY_DASSERT(table->rows() > static_cast<int64_t>(extent->second));
  ApplyArgs with_table = args;
  with_table.table = table.get();
  with_table.numerics = table->mode();
  detail::apply_validated(schedule_, with_table);
}

}  // namespace rotary
