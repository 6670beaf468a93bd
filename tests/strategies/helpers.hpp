// Kept for the tests that include it by this name; the helpers live in tests/.
#pragma once
#include "experiment_helpers.hpp"
