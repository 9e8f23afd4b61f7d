#include <iostream>

#include "dev.hpp"

int main(int argc, char** argv) { return rotary::cli::run_dev(argc, argv, std::cout, std::cerr); }
