// rotary — the old name of pairing.hpp (converting between interleaved and half pairing), kept
// for one release: include "rotary/pairing.hpp".
#pragma once

#include "rotary/pairing.hpp"
