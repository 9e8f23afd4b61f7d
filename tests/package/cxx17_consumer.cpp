// A consumer built with -std=c++17 (tests/package/cxx17.cmake): rotary must say it needs C++20.
#include <rotary/rotary.hpp>

int main() { return rotary::max_position_limit > 0 ? 0 : 1; }
