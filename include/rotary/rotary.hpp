// rotary — Rotary Position Embeddings: exact schedules and tables, fast kernels.
// Data path: Spec -> make_schedule -> (Table) -> apply.
#pragma once

#if __cplusplus < 202002L
#error "rotary needs C++20 (-std=c++20)"
#endif

#include "rotary/angle.hpp"
#include "rotary/apply.hpp"
#include "rotary/doctor.hpp"
#include "rotary/error.hpp"
#include "rotary/fused.hpp"
#include "rotary/hf_config.hpp"
#include "rotary/layout.hpp"
#include "rotary/positions.hpp"
#include "rotary/rerotate.hpp"
#include "rotary/schedule.hpp"
#include "rotary/spec.hpp"
#include "rotary/spec_fields.hpp"
#include "rotary/table.hpp"
#include "rotary/tensor.hpp"
