// libFuzzer target: Chakra ET protobuf import; the input format is in chakra_fuzz.hpp.
#include <cstddef>
#include <cstdint>

#include "fuzz/chakra_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  return stratasim::fuzz::fuzz_chakra(bytes, size, /*json_form=*/false);
}
