#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>

#include "hw_models/units.hpp"

using namespace stratasim;

TEST_CASE("durations parse with every unit and print readably") {
  CHECK(parse_time("2 us") == Time::us(2));
  CHECK(parse_time("1.5 us") == Time::ns(1500));
  CHECK(parse_time("1.5us") == Time::ns(1500));
  CHECK(parse_time("250 ns") == Time::ps(250'000));
  CHECK(parse_time("3 ps") == Time::ps(3));
  CHECK(parse_time("0.5 s") == Time::ms(500));
  CHECK(parse_time("2 ms") == Time::ms(2));
  CHECK(parse_time("1e-6 s") == Time::us(1));
  CHECK(parse_time("0 us") == Time::zero());
  CHECK(to_string(Time::ns(1500)) == "1.5 us");
  CHECK(to_string(Time::ms(12)) == "12 ms");
  CHECK(to_string(Time::infinity()) == "never");
}

TEST_CASE("sizes: decimal and binary prefixes, bits and bytes") {
  CHECK(parse_bytes("80 GiB") == Bytes(80LL << 30));
  CHECK(parse_bytes("40 GB") == Bytes(40'000'000'000LL));
  CHECK(parse_bytes("512 MiB") == Bytes(512LL << 20));
  CHECK(parse_bytes("1 KiB") == Bytes(1024));
  CHECK(parse_bytes("1 kB") == Bytes(1000));
  CHECK(parse_bytes("1e9 B") == Bytes(1'000'000'000LL));
  CHECK(parse_bytes("100 Mb") == Bytes(12'500'000));  // 100e6 bits / 8
  CHECK(parse_bytes("1 TiB") == Bytes(1LL << 40));
  CHECK(to_string(Bytes(80LL << 30)) == "80 GiB");
}

TEST_CASE("bandwidths: bytes and bits per second") {
  CHECK(parse_bandwidth("2.039 TB/s").bytes_per_second() == doctest::Approx(2.039e12));
  CHECK(parse_bandwidth("900 GB/s").bytes_per_second() == doctest::Approx(900e9));
  CHECK(parse_bandwidth("25 Gb/s").bytes_per_second() == doctest::Approx(25e9 / 8));
  CHECK(parse_bandwidth("200 Gbps").bytes_per_second() == doctest::Approx(25e9));
  CHECK(parse_bandwidth("16 GiB/s").bytes_per_second() == doctest::Approx(16.0 * (1LL << 30)));
  CHECK(to_string(Bandwidth(900e9)) == "900 GB/s");
}

TEST_CASE("compute rates and work") {
  CHECK(parse_flop_rate("312 TFLOP/s").flops_per_second() == doctest::Approx(312e12));
  CHECK(parse_flop_rate("19.5 TFLOPS").flops_per_second() == doctest::Approx(19.5e12));
  CHECK(parse_flop_rate("1 PFLOP/s").flops_per_second() == doctest::Approx(1e15));
  CHECK(parse_flops("3.1 EFLOP").count() == doctest::Approx(3.1e18));
  CHECK(to_string(FlopRate(312e12)) == "312 TFLOP/s");
}

TEST_CASE("malformed quantities are errors that say what was expected") {
  CHECK_THROWS_WITH_AS(parse_time("2"), doctest::Contains("with a unit"), UnitError);
  CHECK_THROWS_WITH_AS(parse_time("fast"), doctest::Contains("such as \"2 us\""), UnitError);
  CHECK_THROWS_AS(parse_time("-1 us"), UnitError);
  CHECK_THROWS_AS(parse_bytes("80 GiBs"), UnitError);
  CHECK_THROWS_AS(parse_bandwidth("900 GB"), UnitError);
  CHECK_THROWS_AS(parse_flop_rate("312 TB/s"), UnitError);
  CHECK_THROWS_AS(parse_time("1e30 s"), UnitError);
}

TEST_CASE("rates below the sane bounds (1 MB/s, 1 MFLOP/s) are errors naming the bound") {
  // 1e-30 Gb/s would move 1 GiB in 8.6e39 s: simulated time (2^63 ps) overflows later.
  CHECK_THROWS_WITH_AS(parse_bandwidth("1e-30 Gb/s"), doctest::Contains("at least 1 MB/s"),
                       UnitError);
  CHECK_THROWS_AS(parse_bandwidth("999 kB/s"), UnitError);
  CHECK(parse_bandwidth("1 MB/s").bytes_per_second() == 1e6);
  CHECK(parse_bandwidth("8 Mb/s").bytes_per_second() == 1e6);  // 8 Mbit = 1 MB
  CHECK(parse_bandwidth("0 GB/s").bytes_per_second() == 0);    // "none", where allowed
  CHECK_THROWS_AS(parse_bandwidth("1e300 EB/s"), UnitError);   // 1e318 B/s: not finite
  CHECK_THROWS_WITH_AS(parse_flop_rate("1e-20 TFLOP/s"), doctest::Contains("at least 1 MFLOP/s"),
                       UnitError);
  CHECK(parse_flop_rate("1 MFLOP/s").flops_per_second() == 1e6);
  CHECK(parse_flop_rate("0 TFLOP/s").flops_per_second() == 0);
}

TEST_CASE("time arithmetic is exact and transfer times round up to a picosecond") {
  // 1 GB at 1 TB/s = 1 ms exactly.
  CHECK(transfer_time(Bytes(1'000'000'000), Bandwidth(1e12)) == Time::ms(1));
  // 1 byte at 3 B/s = 333,333,333,333.33 ps -> rounds up.
  CHECK(transfer_time(Bytes(1), Bandwidth(3)) == Time::ps(333'333'333'334));
  CHECK(transfer_time(Bytes(0), Bandwidth(1)) == Time::zero());
  CHECK(compute_time(Flops(312e12), FlopRate(312e12)) == Time::ms(1000));
  CHECK(Time::us(3) - Time::us(1) == Time::us(2));
}

TEST_CASE("time sums past 2^63 picoseconds throw instead of wrapping") {
  // 2^62 + 2^62 = 2^63 is one past INT64_MAX.
  const Time half = Time::ps(std::int64_t{1} << 62);
  CHECK_THROWS_AS(half + half, std::overflow_error);
  Time t = half;
  CHECK_THROWS_AS(t += half, std::overflow_error);
  CHECK((half + Time::ps((std::int64_t{1} << 62) - 1)).picoseconds() ==
        std::numeric_limits<std::int64_t>::max());
}
