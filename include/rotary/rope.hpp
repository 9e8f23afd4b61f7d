// rotary::Rope — a schedule with its own angle tables: what a model holds once and calls per layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "rotary/apply.hpp"
#include "rotary/schedule.hpp"
#include "rotary/spec.hpp"
#include "rotary/table.hpp"

namespace rotary {

/// A schedule and a cache of its cos/sin tables for positions [0, n), one per AngleMode, grown on
/// demand (by doubling, from 4096 rows) up to cache_bytes each. apply() takes a call's angles from
/// the cache when its positions are whole and within it and the tensors are not f64, else computes
/// them on the fly: the same bits either way (a table row is what apply computes for its position
/// in float32; f64 tensors turn by double cos and sin, computed on the fly).
///
/// Safe to share between threads: a published table is immutable; growing publishes a new one
/// under a mutex, and every call holds the table it reads (shared_ptr) until it returns. Movable,
/// not copyable (the copy would share nothing).
class Rope {
 public:
  /// make_schedule(spec, seq_len): throws Error as it does.
  explicit Rope(const Spec& spec, std::optional<int64_t> seq_len = std::nullopt);
  /// A schedule made elsewhere (read_schedule, with_xpos, ...).
  explicit Rope(Schedule schedule);
  Rope(Rope&&) noexcept;
  Rope& operator=(Rope&&) noexcept;
  ~Rope();

  const Schedule& schedule() const { return schedule_; }

  /// The most bytes of one cached table (cos and sin, float32): 64 MiB.
  static constexpr int64_t cache_bytes = int64_t{64} << 20;
  /// Rows of the largest cached table: cache_bytes / (8 * pairs).
  int64_t max_cached_rows() const;

  /// The cached table of `mode` when one covering positions [0, rows) is already published, else
  /// null. Never waits (a thread growing the table makes this return null): for callers that must
  /// not block, e.g. while holding Python's GIL.
  std::shared_ptr<const Table> cached(int64_t rows, AngleMode mode) const;
  /// A table of `mode` covering positions [0, rows), grown when needed (one thread grows, the
  /// others wait for its table); null when rows > max_cached_rows() (or rows <= 0).
  std::shared_ptr<const Table> table(int64_t rows, AngleMode mode) const;

  /// apply(schedule(), args) with the angles numerics_of(args) names: from the cache when the
  /// positions are whole and below max_cached_rows() (and q is not f64), else computed on the fly. args.table must be
  /// null (the Rope picks it); caller angles (args.caller_angles) are used as given. Validation, messages
  /// and guarantees as apply (positions are read once to validate, once by the kernel).
  void apply(const ApplyArgs& args) const;

 private:
  struct Caches;
  Schedule schedule_;
  std::unique_ptr<Caches> caches_;
};

}  // namespace rotary
