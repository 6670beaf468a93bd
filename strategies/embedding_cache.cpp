// Placeholder: replaced by the implementation in this branch's work.
#include "strategies/embedding_cache.hpp"
