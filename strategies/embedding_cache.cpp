#include "strategies/embedding_cache.hpp"
#include "strategies/random.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace stratasim::strategies {

std::string_view name_of(CachePolicy p) {
  switch (p) {
    case CachePolicy::frequency:
      return "frequency";
    case CachePolicy::lfu:
      return "lfu";
    case CachePolicy::lru:
      return "lru";
  }
  return "?";
}

const IdDistribution& EmbeddingCacheSpec::distribution_of(int t) const {
  if (t >= 0 && static_cast<std::size_t>(t) < per_table.size() && per_table[t]) {
    return *per_table[t];
  }
  return distribution;
}

namespace {

// ---- The generator (strategies/random.hpp), one stream per (seed, table).

Xoshiro256 table_rng(std::uint64_t seed, std::uint64_t stream) {
  return Xoshiro256(seed ^ (stream * 0xD1342543DE82EF95ULL + 0x2545F4914F6CDD1DULL));
}

// ---- Zipf: sums and the rejection-inversion sampler.

// expm1(t) / t, and 1 at t = 0.
double expm1_over(double t) {
  if (std::abs(t) > 1e-8) return std::expm1(t) / t;
  return 1 + t * (0.5 + t / 6);
}

// log1p(t) / t, and 1 at t = 0.
double log1p_over(double t) {
  if (std::abs(t) > 1e-8) return std::log1p(t) / t;
  return 1 - t * (0.5 - t / 3);
}

// sum_{k=1}^{n} k^-s: direct up to kDirect terms; past them the Euler-Maclaurin formula from
// m = kDirect / 2 to n with the Bernoulli terms B2, B4, B6 (the next is below 1e-30 of the sum
// at m = 1000).
double zipf_sum(std::int64_t n, double s) {
  constexpr std::int64_t kDirect = 2000;
  if (n <= kDirect) {
    double sum = 0;
    for (std::int64_t k = n; k >= 1; --k) sum += std::pow(static_cast<double>(k), -s);
    return sum;
  }
  constexpr std::int64_t m = kDirect / 2;
  double sum = zipf_sum(m - 1, s);
  const double a = static_cast<double>(m), b = static_cast<double>(n);
  const double log_ratio = std::log(b / a);
  // integral_a^b x^-s dx = a^(1-s) (e^((1-s) log(b/a)) - 1) / (1-s), stable at s = 1.
  sum += std::pow(a, 1 - s) * expm1_over((1 - s) * log_ratio) * log_ratio;
  sum += (std::pow(a, -s) + std::pow(b, -s)) / 2;
  // f'(x) = -s x^(-s-1); f'''(x) = -s(s+1)(s+2) x^(-s-3); f^(5)(x) = -s..(s+4) x^(-s-5).
  const auto derivative = [s](double x, int order) {
    double c = -1;
    for (int i = 0; i < order; ++i) c *= s + i;
    return c * std::pow(x, -s - order);
  };
  sum += (derivative(b, 1) - derivative(a, 1)) / 12;
  sum -= (derivative(b, 3) - derivative(a, 3)) / 720;
  sum += (derivative(b, 5) - derivative(a, 5)) / 30240;
  return sum;
}

// Hörmann & Derflinger's rejection-inversion for P(k) ~ k^-s, k = 1..n, with the hat
// h(x) = x^-s integrated as H(x) = (x^(1-s) - 1) / (1-s) (log x at s = 1): x = H^-1(u) for u
// uniform between H(1.5) - h(1) and H(n + 0.5), k = round(x), accepted when k - x <= s_ (the
// squeeze) or u >= H(k + 0.5) - h(k). Expected iterations stay below 1.1 for every s > 0.
class ZipfSampler {
 public:
  ZipfSampler(std::int64_t n, double s) : n_(n), s_(s) {
    h_integral_x1_ = h_integral(1.5) - 1;
    h_integral_n_ = h_integral(static_cast<double>(n) + 0.5);
    squeeze_ = 2 - h_integral_inverse(h_integral(2.5) - h(2));
  }
  /// An id in [0, n): k - 1.
  std::int64_t draw(Xoshiro256& rng) const {
    for (;;) {
      const double u = h_integral_n_ + rng.unit() * (h_integral_x1_ - h_integral_n_);
      const double x = h_integral_inverse(u);
      auto k = static_cast<std::int64_t>(x + 0.5);
      k = std::clamp<std::int64_t>(k, 1, n_);
      const double kd = static_cast<double>(k);
      if (kd - x <= squeeze_ || u >= h_integral(kd + 0.5) - h(kd)) return k - 1;
    }
  }

 private:
  double h(double x) const { return std::exp(-s_ * std::log(x)); }
  double h_integral(double x) const {
    const double log_x = std::log(x);
    return expm1_over((1 - s_) * log_x) * log_x;
  }
  double h_integral_inverse(double u) const {
    double t = u * (1 - s_);
    if (t < -1) t = -1;  // rounding at the lower end of the range
    return std::exp(log1p_over(t) * u);
  }

  std::int64_t n_;
  double s_;
  double h_integral_x1_ = 0, h_integral_n_ = 0, squeeze_ = 0;
};

// ---- Any distribution: draws and probabilities.

class IdSampler {
 public:
  IdSampler(std::int64_t rows, const IdDistribution& d)
      : kind_(d.kind),
        rows_(rows),
        zipf_(rows, d.kind == IdDistributionKind::zipf ? d.exponent : 1) {
    if (kind_ == IdDistributionKind::zipf) {
      exponent_ = d.exponent;
      norm_ = zipf_sum(rows, d.exponent);
    } else if (kind_ == IdDistributionKind::histogram) {
      build_histogram(d.weights);
    }
  }

  std::int64_t draw(Xoshiro256& rng) const {
    switch (kind_) {
      case IdDistributionKind::uniform:
        return static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(rows_)));
      case IdDistributionKind::zipf:
        return zipf_.draw(rng);
      case IdDistributionKind::histogram:
        break;
    }
    const double u = rng.unit() * total_;
    if (u < head_total_) {
      const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
      return std::min<std::int64_t>(it - cdf_.begin(), static_cast<std::int64_t>(cdf_.size()) - 1);
    }
    const auto head = static_cast<std::int64_t>(cdf_.size());
    return head + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(rows_ - head)));
  }

  double probability(std::int64_t id) const {
    switch (kind_) {
      case IdDistributionKind::uniform:
        return 1 / static_cast<double>(rows_);
      case IdDistributionKind::zipf:
        return std::pow(static_cast<double>(id + 1), -exponent_) / norm_;
      case IdDistributionKind::histogram:
        break;
    }
    const auto head = static_cast<std::int64_t>(cdf_.size());
    if (id >= head) return tail_weight_ / total_;
    return (cdf_[id] - (id == 0 ? 0 : cdf_[id - 1])) / total_;
  }

 private:
  void build_histogram(const std::vector<double>& weights) {
    if (weights.empty()) throw std::invalid_argument("a histogram distribution without weights");
    const auto head = std::min<std::int64_t>(rows_, static_cast<std::int64_t>(weights.size()));
    cdf_.resize(head);
    double sum = 0;
    for (std::int64_t i = 0; i < head; ++i) cdf_[i] = sum += weights[i];
    head_total_ = sum;
    tail_weight_ = weights[head - 1];
    total_ = head_total_ + tail_weight_ * static_cast<double>(rows_ - head);
    if (!(total_ > 0)) throw std::invalid_argument("a histogram distribution of zero weight");
  }

  IdDistributionKind kind_;
  std::int64_t rows_;
  ZipfSampler zipf_;
  double exponent_ = 1, norm_ = 1;
  std::vector<double> cdf_;  // histogram: cumulative weights of its ids within the table
  double head_total_ = 0, tail_weight_ = 0, total_ = 1;
};

// ---- Hash maps of ids (>= 0): open addressing, linear probing.

class IdMap {
 public:
  /// Room for `expected` ids at half load; more double the buckets (a map sized to what it
  /// holds stays in the CPU's caches).
  explicit IdMap(std::size_t expected) {
    resize(std::bit_ceil(std::max<std::size_t>(16, 2 * expected)));
  }
  /// The value of `id`, or -1.
  std::int32_t find(std::int64_t id) const {
    for (std::size_t i = home(id);; i = (i + 1) & mask_) {
      if (buckets_[i].id == id) return buckets_[i].value;
      if (buckets_[i].id == kEmpty) return -1;
    }
  }
  /// The bucket of `id`, inserted with `value` when absent; `inserted` says which.
  std::size_t find_or_insert(std::int64_t id, std::int32_t value, bool& inserted) {
    if (2 * (count_ + 1) > buckets_.size()) resize(2 * buckets_.size());
    std::size_t i = home(id);
    for (; buckets_[i].id != kEmpty; i = (i + 1) & mask_) {
      if (buckets_[i].id == id) {
        inserted = false;
        return i;
      }
    }
    buckets_[i] = {id, value};
    ++count_;
    inserted = true;
    return i;
  }
  std::int32_t value_at(std::size_t bucket) const { return buckets_[bucket].value; }
  /// Removes `id` (present), shifting back the entries of its probe run.
  void erase(std::int64_t id) {
    std::size_t i = home(id);
    while (buckets_[i].id != id) i = (i + 1) & mask_;
    for (std::size_t j = (i + 1) & mask_; buckets_[j].id != kEmpty; j = (j + 1) & mask_) {
      const std::size_t h = home(buckets_[j].id);
      // Move j into the hole at i unless its home lies cyclically in (i, j].
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        buckets_[i] = buckets_[j];
        i = j;
      }
    }
    buckets_[i].id = kEmpty;
    --count_;
  }
  /// Empties the given buckets (those find_or_insert returned since the last reset, the map
  /// not having grown since: it holds `expected` ids without growing).
  void reset(const std::vector<std::size_t>& buckets) {
    for (std::size_t b : buckets) buckets_[b].id = kEmpty;
    count_ -= buckets.size();
  }

 private:
  static constexpr std::int64_t kEmpty = -1;
  struct Bucket {  // one cache line holds four: a probe reads the id and its value together
    std::int64_t id = kEmpty;
    std::int32_t value = 0;
  };
  std::size_t home(std::int64_t id) const {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(id) * 0x9E3779B97F4A7C15ULL) >>
                                    shift_);
  }
  void resize(std::size_t size) {
    std::vector<Bucket> old(size, Bucket{});
    old.swap(buckets_);
    mask_ = size - 1;
    shift_ = 64 - std::countr_zero(size);
    count_ = 0;
    bool inserted = false;
    for (const Bucket& b : old) {
      if (b.id != kEmpty) find_or_insert(b.id, b.value, inserted);
    }
  }
  std::vector<Bucket> buckets_;
  std::size_t count_ = 0;
  std::size_t mask_ = 0;
  int shift_ = 0;
};

// Slots of cached ids: a flat array for the hottest ids (below `dense`, O(capacity) of them:
// most lookups, read where they lie together) and a hash map for the others.
class SlotIndex {
 public:
  explicit SlotIndex(std::int64_t dense)
      : dense_(static_cast<std::size_t>(dense), -1), sparse_(1024) {}
  std::int32_t find(std::int64_t id) const {
    return id < static_cast<std::int64_t>(dense_.size()) ? dense_[id] : sparse_.find(id);
  }
  void insert(std::int64_t id, std::int32_t slot) {
    if (id < static_cast<std::int64_t>(dense_.size())) {
      dense_[id] = slot;
      return;
    }
    bool inserted = false;
    sparse_.find_or_insert(id, slot, inserted);
  }
  void erase(std::int64_t id) {
    if (id < static_cast<std::int64_t>(dense_.size())) {
      dense_[id] = -1;
    } else {
      sparse_.erase(id);
    }
  }

 private:
  std::vector<std::int32_t> dense_;
  IdMap sparse_;
};

// ---- The caches.

// One unique row of a batch.
struct BatchRow {
  std::int64_t id = 0;
  std::int64_t lookups = 0;
  std::int64_t last = 0;  // the stream position of its last lookup
};

// The rows a cache holds, by policy. A batch is handled in two steps: use() finds the batch's
// cached rows (their lookups hit) and marks them used; load() brings in the missing ones,
// evicting first rows the batch does not use, the least valued first, and, past the capacity,
// the least valued of the batch's own.
class Resident {
 public:
  virtual ~Resident() = default;
  /// The hit lookups of the batch's unique `rows`; those not cached are put in `missing`.
  virtual std::int64_t use(const std::vector<BatchRow>& rows, std::int64_t batch,
                           std::vector<BatchRow>& missing) = 0;
  /// Loads `missing` (rows of batch `batch`); the rows evicted.
  virtual std::int64_t load(const std::vector<BatchRow>& missing, std::int64_t batch) = 0;
  virtual std::int64_t size() const = 0;
};

// The frequency-aware cache: ids rank by themselves (the highest id, the least frequent, is
// evicted first), so no per-row state is needed: a bitset of the cached ids among the
// warm-up's 0 .. capacity-1 (scanned downward from the highest cached one), and the cached ids
// past them in a hash map and a max-heap. Memory: capacity / 8 bytes and the few colder rows.
class FrequencyCache final : public Resident {
 public:
  FrequencyCache(std::int64_t capacity, std::int64_t batch_rows)
      : capacity_(capacity),
        bits_(static_cast<std::size_t>((capacity + 63) / 64), ~std::uint64_t{0}),
        extras_(1024),
        batch_(static_cast<std::size_t>(batch_rows)) {
    if (capacity % 64 != 0) bits_.back() = (std::uint64_t{1} << (capacity % 64)) - 1;
    top_ = capacity - 1;
    size_ = capacity;
  }

  std::int64_t use(const std::vector<BatchRow>& rows, std::int64_t /*batch*/,
                   std::vector<BatchRow>& missing) override {
    std::int64_t hits = 0;
    for (const BatchRow& r : rows) {
      bool inserted = false;
      buckets_.push_back(batch_.find_or_insert(r.id, 0, inserted));
      if (cached(r.id)) {
        hits += r.lookups;
      } else {
        missing.push_back(r);
      }
    }
    return hits;
  }

  std::int64_t load(const std::vector<BatchRow>& missing, std::int64_t /*batch*/) override {
    std::int64_t evicted = 0;
    const std::int64_t room = size_ + static_cast<std::int64_t>(missing.size()) - capacity_;
    if (room > 0) evicted += evict(room, true);
    for (const BatchRow& r : missing) add(r.id);
    if (size_ > capacity_) evicted += evict(size_ - capacity_, false);
    batch_.reset(buckets_);
    buckets_.clear();
    return evicted;
  }

  std::int64_t size() const override { return size_; }

 private:
  bool bit(std::int64_t id) const { return (bits_[id >> 6] >> (id & 63)) & 1; }
  bool cached(std::int64_t id) const { return id < capacity_ ? bit(id) : extras_.find(id) >= 0; }
  bool in_batch(std::int64_t id) const { return batch_.find(id) >= 0; }
  void add(std::int64_t id) {
    if (id < capacity_) {
      bits_[id >> 6] |= std::uint64_t{1} << (id & 63);
      top_ = std::max(top_, id);
    } else {
      bool inserted = false;
      extras_.find_or_insert(id, 0, inserted);
      extra_heap_.push(id);
    }
    ++size_;
  }
  // The highest cached id of the bitset at or below `i`, or -1.
  std::int64_t highest_at_or_below(std::int64_t i) const {
    if (i < 0) return -1;
    std::int64_t w = i >> 6;
    const int b = static_cast<int>(i & 63);
    std::uint64_t m = bits_[w] & (b == 63 ? ~std::uint64_t{0} : (std::uint64_t{2} << b) - 1);
    while (m == 0 && w > 0) m = bits_[--w];
    if (m == 0) return -1;
    return w * 64 + 63 - std::countl_zero(m);
  }
  // Evicts up to `n` rows, the highest ids first (those past the bitset, then the bitset's),
  // sparing the batch's rows when `spare`; the number evicted.
  std::int64_t evict(std::int64_t n, bool spare) {
    std::int64_t evicted = 0;
    kept_.clear();
    while (evicted < n && !extra_heap_.empty()) {
      const std::int64_t id = extra_heap_.top();
      extra_heap_.pop();
      if (spare && in_batch(id)) {
        kept_.push_back(id);
      } else {
        extras_.erase(id);
        ++evicted;
      }
    }
    for (std::int64_t id : kept_) extra_heap_.push(id);
    std::int64_t i = top_, highest_kept = -1;
    while (evicted < n && (i = highest_at_or_below(i)) >= 0) {
      if (spare && in_batch(i)) {
        highest_kept = std::max(highest_kept, i);
      } else {
        bits_[i >> 6] &= ~(std::uint64_t{1} << (i & 63));
        ++evicted;
      }
      --i;
    }
    top_ = std::max(highest_kept, i);  // no cached id of the bitset above it
    size_ -= evicted;
    return evicted;
  }

  std::int64_t capacity_, size_ = 0, top_ = -1;
  std::vector<std::uint64_t> bits_;  // ids 0 .. capacity-1
  IdMap extras_;                     // cached ids >= capacity
  std::priority_queue<std::int64_t> extra_heap_;
  IdMap batch_;  // the batch's ids
  std::vector<std::size_t> buckets_;
  std::vector<std::int64_t> kept_;
};

// LFU and LRU: cached rows by id, and a min-heap of them by the policy's key (the least
// valued row, evicted first, at the top).

struct Key {
  std::int64_t major = 0, minor = 0;
  bool operator<(const Key& o) const {
    return major != o.major ? major < o.major : minor < o.minor;
  }
};

class Cache {
 public:
  Cache(std::int64_t rows, std::int64_t capacity, std::int64_t batch_rows)
      : capacity_(capacity), map_(std::min(rows, 2 * (capacity + batch_rows))) {}

  std::int64_t size() const { return static_cast<std::int64_t>(heap_.size()); }
  std::int64_t capacity() const { return capacity_; }
  std::int32_t slot_of(std::int64_t id) const { return map_.find(id); }
  const Key& key(std::int32_t slot) const { return heap_[pos_[slot]].key; }

  /// Marks `slot` as used by batch `batch` and gives it `key` (of any order to the old one).
  void use(std::int32_t slot, Key key, std::int64_t batch) {
    stamp_[slot] = batch;
    const std::size_t i = pos_[slot];
    const bool up = key < heap_[i].key;
    heap_[i].key = key;
    if (up) {
      sift_up(i);
    } else {
      sift_down(i);
    }
  }

  void insert(std::int64_t id, Key key, std::int64_t batch) {
    std::int32_t slot = 0;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = static_cast<std::int32_t>(id_.size());
      id_.push_back(0);
      pos_.push_back(0);
      stamp_.push_back(0);
    }
    id_[slot] = id;
    stamp_[slot] = batch;
    map_.insert(id, slot);
    push({key, slot});
  }

  /// Evicts up to `n` of the least valued rows that batch `batch` does not use; the number
  /// evicted.
  std::int64_t evict_unused(std::int64_t n, std::int64_t batch) {
    std::int64_t evicted = 0;
    kept_.clear();
    while (evicted < n && !heap_.empty()) {
      const Entry top = pop();
      if (stamp_[top.slot] == batch) {
        kept_.push_back(top);
      } else {
        release(top.slot);
        ++evicted;
      }
    }
    for (const Entry& e : kept_) push(e);
    return evicted;
  }

  /// Evicts the least valued rows while more than the capacity are cached; the number evicted.
  std::int64_t trim() {
    std::int64_t evicted = 0;
    while (size() > capacity_) {
      release(pop().slot);
      ++evicted;
    }
    return evicted;
  }

 private:
  // A 4-ary heap (half the depth of a binary one: fewer cache misses per sift); an entry
  // carries its key, so that sifting reads one array.
  static constexpr std::size_t kArity = 4;
  struct Entry {
    Key key;
    std::int32_t slot = 0;
  };

  void push(const Entry& e) {
    heap_.push_back(e);
    sift_up(heap_.size() - 1);
  }
  Entry pop() {
    const Entry top = heap_.front();
    heap_.front() = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) sift_down(0);
    return top;
  }
  void release(std::int32_t slot) {
    map_.erase(id_[slot]);
    free_.push_back(slot);
  }
  void place(std::size_t i, const Entry& e) {
    heap_[i] = e;
    pos_[e.slot] = static_cast<std::int32_t>(i);
  }
  void sift_up(std::size_t i) {
    const Entry e = heap_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / kArity;
      if (!(e.key < heap_[parent].key)) break;
      place(i, heap_[parent]);
      i = parent;
    }
    place(i, e);
  }
  void sift_down(std::size_t i) {
    const Entry e = heap_[i];
    const std::size_t n = heap_.size();
    for (;;) {
      const std::size_t first = kArity * i + 1;
      if (first >= n) break;
      std::size_t child = first;
      for (std::size_t c = first + 1; c < std::min(first + kArity, n); ++c) {
        if (heap_[c].key < heap_[child].key) child = c;
      }
      if (!(heap_[child].key < e.key)) break;
      place(i, heap_[child]);
      i = child;
    }
    place(i, e);
  }

  std::int64_t capacity_;
  SlotIndex map_;                    // id -> slot
  std::vector<std::int64_t> id_;     // slot -> id
  std::vector<std::int32_t> pos_;    // slot -> index in heap_
  std::vector<std::int64_t> stamp_;  // slot -> the last batch that used it
  std::vector<Entry> heap_;
  std::vector<std::int32_t> free_;
  std::vector<Entry> kept_;
};

// LFU (key: lookups while cached, then the last lookup's position) or LRU (key: the last
// lookup's position) over a Cache.
class RankedCache final : public Resident {
 public:
  RankedCache(CachePolicy policy, std::int64_t rows, std::int64_t capacity, std::int64_t batch_rows)
      : lfu_(policy == CachePolicy::lfu), cache_(rows, capacity, batch_rows) {}

  std::int64_t use(const std::vector<BatchRow>& rows, std::int64_t batch,
                   std::vector<BatchRow>& missing) override {
    std::int64_t hits = 0;
    for (const BatchRow& r : rows) {
      const std::int32_t slot = cache_.slot_of(r.id);
      if (slot < 0) {
        missing.push_back(r);
        continue;
      }
      hits += r.lookups;
      const Key old = cache_.key(slot);
      cache_.use(slot, lfu_ ? Key{old.major + r.lookups, r.last} : Key{r.last, 0}, batch);
    }
    return hits;
  }

  std::int64_t load(const std::vector<BatchRow>& missing, std::int64_t batch) override {
    std::int64_t evicted = 0;
    const std::int64_t room =
        cache_.size() + static_cast<std::int64_t>(missing.size()) - cache_.capacity();
    if (room > 0) evicted += cache_.evict_unused(room, batch);
    for (const BatchRow& r : missing) {
      cache_.insert(r.id, lfu_ ? Key{r.lookups, r.last} : Key{r.last, 0}, batch);
    }
    return evicted + cache_.trim();
  }

  std::int64_t size() const override { return cache_.size(); }

 private:
  bool lfu_;
  Cache cache_;
};

std::unique_ptr<Resident> make_cache(CachePolicy policy, std::int64_t rows, std::int64_t capacity,
                                     std::int64_t batch_rows) {
  if (policy == CachePolicy::frequency) {
    return std::make_unique<FrequencyCache>(capacity, batch_rows);
  }
  return std::make_unique<RankedCache>(policy, rows, capacity, batch_rows);
}

// ---- The simulation of one table's cache.

class Simulation {
 public:
  Simulation(std::int64_t rows, std::int64_t capacity, std::int64_t lookups,
             const IdDistribution& dist, const EmbeddingCacheSpec& spec, int table)
      : capacity_(capacity),
        real_lookups_(lookups),
        drawn_(std::min(lookups, spec.max_lookups_per_batch)),
        sampler_(rows, dist),
        rng_(table_rng(spec.seed, static_cast<std::uint64_t>(table))),
        cache_(make_cache(spec.policy, rows, capacity, drawn_)),
        batch_map_(static_cast<std::size_t>(drawn_)) {
    ids_.resize(drawn_);
  }

  void run_batch(std::int64_t batch, bool measured) {
    collect(batch);
    missing_.clear();
    const std::int64_t hits = cache_->use(rows_, batch, missing_);
    const std::int64_t evicted = cache_->load(missing_, batch);
    if (measured) count(hits, static_cast<std::int64_t>(missing_.size()), evicted);
  }

  bool full() const { return cache_->size() == capacity_; }

  CacheStats stats(std::int64_t capacity, std::int64_t batches) const {
    CacheStats s;
    s.capacity_rows = capacity;
    s.hit_rate = lookups_ == 0 ? 1.0 : static_cast<double>(hits_) / static_cast<double>(lookups_);
    const auto n = static_cast<double>(batches);
    if (!subsampled()) {
      s.misses_per_batch = static_cast<double>(misses_) / n;
      s.evictions_per_batch = static_cast<double>(evictions_) / n;
    } else {
      s.misses_per_batch = estimated_misses_ / n;
      const double scale = misses_ == 0 ? 0 : estimated_misses_ / static_cast<double>(misses_);
      s.evictions_per_batch = static_cast<double>(evictions_) * scale / n;
    }
    s.batches_over_capacity = over_capacity_;
    return s;
  }

 private:
  bool subsampled() const { return drawn_ < real_lookups_; }

  // Draws the batch's ids and gathers its unique rows, in the order of their first lookup.
  void collect(std::int64_t batch) {
    for (auto& id : ids_) id = sampler_.draw(rng_);
    rows_.clear();
    buckets_.clear();
    const std::int64_t base = batch * drawn_;
    for (std::int64_t i = 0; i < drawn_; ++i) {
      bool inserted = false;
      const std::size_t b =
          batch_map_.find_or_insert(ids_[i], static_cast<std::int32_t>(rows_.size()), inserted);
      if (inserted) {
        buckets_.push_back(b);
        rows_.push_back({ids_[i], 0, 0});
      }
      BatchRow& r = rows_[batch_map_.value_at(b)];
      ++r.lookups;
      r.last = base + i;
    }
    batch_map_.reset(buckets_);
  }

  // Unique rows of a real batch of real_lookups_ that the drawn ones (of `rows`) stand for.
  double real_unique(const std::vector<BatchRow>& rows) const {
    const double b = static_cast<double>(real_lookups_);
    const double scale = b / static_cast<double>(drawn_);
    double sum = 0;
    for (const BatchRow& r : rows) {
      const double p = sampler_.probability(r.id);
      const double seen = -std::expm1(b * std::log1p(-p));  // 1 - (1 - p)^B
      sum += static_cast<double>(r.lookups) * scale * seen / (b * p);
    }
    return sum;
  }

  void count(std::int64_t hits, std::int64_t missed, std::int64_t evicted) {
    lookups_ += drawn_;
    hits_ += hits;
    misses_ += missed;
    evictions_ += evicted;
    double unique = static_cast<double>(rows_.size());
    if (subsampled()) {
      estimated_misses_ += real_unique(missing_);
      unique = real_unique(rows_);
    }
    if (unique > static_cast<double>(capacity_)) ++over_capacity_;
  }

  std::int64_t capacity_, real_lookups_, drawn_;
  IdSampler sampler_;
  Xoshiro256 rng_;
  std::unique_ptr<Resident> cache_;
  IdMap batch_map_;  // id -> index in rows_, for the batch being collected
  std::vector<std::int64_t> ids_;
  std::vector<std::size_t> buckets_;
  std::vector<BatchRow> rows_, missing_;
  std::int64_t lookups_ = 0, hits_ = 0, misses_ = 0, evictions_ = 0, over_capacity_ = 0;
  double estimated_misses_ = 0;
};

void check_simulation_inputs(std::int64_t rows, std::int64_t lookups, const IdDistribution& dist,
                             const EmbeddingCacheSpec& spec) {
  if (rows <= 0) throw std::invalid_argument("simulate_cache: a table of no rows");
  if (lookups < 0) throw std::invalid_argument("simulate_cache: negative lookups per batch");
  if (spec.warmup_batches < 0 || spec.measure_batches < 1 || spec.max_lookups_per_batch < 1 ||
      spec.max_lookups_per_batch > std::numeric_limits<std::int32_t>::max()) {
    throw std::invalid_argument("simulate_cache: batch counts out of range");
  }
  if (dist.kind == IdDistributionKind::histogram) {
    const auto& w = dist.weights;
    if (w.empty() || !(w.front() > 0) ||
        std::any_of(w.begin(), w.end(), [](double x) { return !std::isfinite(x) || x < 0; }) ||
        !std::is_sorted(w.begin(), w.end(), std::greater<>())) {
      throw std::invalid_argument(
          "simulate_cache: histogram weights must be finite, >= 0, not all 0 and hottest first");
    }
  }
  if (dist.kind == IdDistributionKind::zipf &&
      !(dist.exponent > 0 && std::isfinite(dist.exponent))) {
    throw std::invalid_argument("simulate_cache: a Zipf exponent must be > 0");
  }
}

}  // namespace

CacheStats simulate_cache(std::int64_t rows, std::int64_t capacity_rows,
                          std::int64_t lookups_per_batch, const IdDistribution& dist,
                          const EmbeddingCacheSpec& spec, int table) {
  check_simulation_inputs(rows, lookups_per_batch, dist, spec);
  const std::int64_t capacity = std::clamp<std::int64_t>(capacity_rows, 0, rows);
  if (capacity == rows || lookups_per_batch == 0) {
    return CacheStats{capacity, 1.0, 0, 0, 0, true};
  }
  Simulation sim(rows, capacity, lookups_per_batch, dist, spec, table);
  // The warm-up: warmup_batches, and past them (lfu and lru start empty) until the cache is
  // full, or until kMaxExtraWarmupDraws more ids are drawn (a cache that the distribution or
  // the budget cannot fill).
  const std::int64_t drawn = std::min(lookups_per_batch, spec.max_lookups_per_batch);
  const std::int64_t extension_batches = (kMaxExtraWarmupDraws + drawn - 1) / drawn;
  std::int64_t b = 0;
  for (; b < spec.warmup_batches; ++b) sim.run_batch(b, false);
  for (std::int64_t e = 0; e < extension_batches && !sim.full(); ++e, ++b) sim.run_batch(b, false);
  const bool filled = sim.full();
  for (std::int64_t m = 0; m < spec.measure_batches; ++m, ++b) sim.run_batch(b, true);
  CacheStats stats = sim.stats(capacity, spec.measure_batches);
  stats.filled = filled;
  return stats;
}

std::vector<std::int64_t> cache_rows(const EmbeddingCacheSpec& spec,
                                     const std::vector<std::int64_t>& rows,
                                     const std::vector<std::int64_t>& row_bytes) {
  if (rows.size() != row_bytes.size()) {
    throw std::invalid_argument("cache_rows: a row size for every table");
  }
  double total_bytes = 0;
  for (std::size_t t = 0; t < rows.size(); ++t) {
    if (rows[t] < 0 || row_bytes[t] <= 0) {
      throw std::invalid_argument("cache_rows: negative rows or a row of no bytes");
    }
    total_bytes += static_cast<double>(rows[t]) * static_cast<double>(row_bytes[t]);
  }
  std::vector<std::int64_t> out(rows.size());
  for (std::size_t t = 0; t < rows.size(); ++t) {
    const auto r = static_cast<double>(rows[t]);
    double c = 0;
    if (spec.fraction) {
      c = std::round(*spec.fraction * r);
    } else if (spec.bytes && total_bytes > 0) {
      c = std::floor(static_cast<double>(spec.bytes->count()) / total_bytes * r);
    }
    out[t] = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::min(c, r)), 0, rows[t]);
  }
  return out;
}

std::vector<std::int64_t> sample_ids(std::int64_t rows, const IdDistribution& dist,
                                     std::int64_t count, std::uint64_t seed, int table) {
  EmbeddingCacheSpec spec;
  spec.seed = seed;
  check_simulation_inputs(rows, count, dist, spec);
  const IdSampler sampler(rows, dist);
  Xoshiro256 rng = table_rng(seed, static_cast<std::uint64_t>(table));
  std::vector<std::int64_t> ids(static_cast<std::size_t>(count));
  for (auto& id : ids) id = sampler.draw(rng);
  return ids;
}

double top_mass(std::int64_t rows, std::int64_t k, const IdDistribution& dist) {
  if (rows <= 0) throw std::invalid_argument("top_mass: a table of no rows");
  k = std::clamp<std::int64_t>(k, 0, rows);
  if (k == rows) return 1.0;
  if (k == 0) return 0.0;
  switch (dist.kind) {
    case IdDistributionKind::uniform:
      return static_cast<double>(k) / static_cast<double>(rows);
    case IdDistributionKind::zipf:
      return zipf_sum(k, dist.exponent) / zipf_sum(rows, dist.exponent);
    case IdDistributionKind::histogram:
      break;
  }
  if (dist.weights.empty()) throw std::invalid_argument("top_mass: a histogram without weights");
  const auto head = std::min<std::int64_t>(rows, static_cast<std::int64_t>(dist.weights.size()));
  const double last = dist.weights[head - 1];
  double within = 0, total = 0;
  for (std::int64_t i = 0; i < head; ++i) {
    total += dist.weights[i];
    if (i < k) within += dist.weights[i];
  }
  within += last * static_cast<double>(std::max<std::int64_t>(0, k - head));
  total += last * static_cast<double>(rows - head);
  return within / total;
}

// ---- Reading.

namespace {

// A number of a histogram file: finite and >= 0; `where` names it in errors.
double histogram_number(config::ObjectReader& r, const std::string& text,
                        const std::string& where) {
  double v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec != std::errc() || end != last || !std::isfinite(v) || v < 0) {
    r.fail("file", where + ": expected a number >= 0 (a relative frequency), got \"" + text + "\"");
  }
  return v;
}

std::string trimmed(const std::string& line) {
  std::size_t b = 0, e = line.size();
  while (b < e && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(line[e - 1]))) --e;
  return line.substr(b, e - b);
}

std::vector<double> histogram_from_json(config::ObjectReader& r, const std::string& text,
                                        const std::string& name) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    r.fail("file", name + ": expected a JSON array of numbers (or one number per line)");
  }
  std::vector<double> weights;
  weights.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string where = name + ": element " + std::to_string(i);
    if (!j[i].is_number()) r.fail("file", where + ": expected a number, got " + j[i].dump());
    weights.push_back(histogram_number(r, j[i].dump(), where));
  }
  return weights;
}

std::vector<double> histogram_from_lines(config::ObjectReader& r, const std::string& text,
                                         const std::string& name) {
  std::vector<double> weights;
  std::istringstream in(text);
  std::string line;
  for (std::int64_t n = 1; std::getline(in, line); ++n) {
    const std::string t = trimmed(line);
    if (t.empty() || t.front() == '#') continue;
    weights.push_back(histogram_number(r, t, name + ":" + std::to_string(n)));
  }
  return weights;
}

// The histogram file named at r's "file", relative to the config file that names it.
IdDistribution read_histogram(config::ObjectReader& r) {
  IdDistribution d;
  d.kind = IdDistributionKind::histogram;
  std::filesystem::path file = r.string("file");
  const std::filesystem::path base = r.document().file_of(r.path_of("file"));
  if (file.is_relative() && !base.empty()) file = base.parent_path() / file;
  file = file.lexically_normal();
  const std::string name = file.string();
  std::ifstream in(file, std::ios::binary);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec) || !in) {
    r.fail("file", "names the histogram file " + name + ", which cannot be read");
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string start = trimmed(text.substr(0, 64));
  d.weights = !start.empty() && start.front() == '[' ? histogram_from_json(r, text, name)
                                                     : histogram_from_lines(r, text, name);
  if (std::none_of(d.weights.begin(), d.weights.end(), [](double w) { return w > 0; })) {
    r.fail("file", name + ": expected relative frequencies, not all 0 (the file has " +
                       std::to_string(d.weights.size()) + " numbers)");
  }
  std::sort(d.weights.begin(), d.weights.end(), std::greater<>());
  d.file = file;
  return d;
}

IdDistribution read_distribution(config::ObjectReader r) {
  const std::string type = r.choice("type", {"uniform", "zipf", "histogram"});
  IdDistribution d;
  if (type == "zipf") {
    d.kind = IdDistributionKind::zipf;
    d.exponent = r.number("exponent");
    if (!(d.exponent > 0) || !std::isfinite(d.exponent)) {
      r.fail("exponent", "expected a Zipf exponent > 0 (P(k) ~ 1/k^exponent; 1.05 is typical)");
    }
  } else if (type == "histogram") {
    d = read_histogram(r);
  }
  r.finish();
  return d;
}

// capacity: a fraction in (0, 1], a percentage "1.5%" or bytes "4 GiB".
void read_capacity(config::ObjectReader& r, EmbeddingCacheSpec& s) {
  constexpr const char* kExpected =
      "expected the cache's size: a fraction of each table's rows in (0, 1] (0.015), a "
      "percentage (\"1.5%\") or bytes per GPU (\"4 GiB\")";
  if (!r.has("capacity")) r.fail("capacity", std::string(kExpected) + "; it is missing");
  const nlohmann::json& v = *r.document().find(r.path_of("capacity"));
  if (v.is_number()) {
    const double f = v.get<double>();
    if (!(f > 0 && f <= 1)) {
      r.fail("capacity", std::string(kExpected) + ", got " + v.dump() +
                             (f > 1 ? " (bytes take a unit: \"" + v.dump() + " B\")" : ""));
    }
    s.fraction = f;
    return;
  }
  if (!v.is_string()) r.fail("capacity", std::string(kExpected) + ", got " + v.dump());
  const std::string text = trimmed(v.get<std::string>());
  if (!text.empty() && text.back() == '%') {
    const std::string number = trimmed(text.substr(0, text.size() - 1));
    double pct = 0;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), pct);
    if (ec != std::errc() || end != number.data() + number.size() || !(pct > 0 && pct <= 100)) {
      r.fail("capacity",
             "expected a percentage in (0, 100] such as \"1.5%\", got \"" + text + "\"");
    }
    s.fraction = pct / 100;
    return;
  }
  try {
    s.bytes = parse_bytes(text);
  } catch (const UnitError& e) {
    r.fail("capacity", std::string(kExpected) + "; \"" + text + "\": " + e.what());
  }
  if (s.bytes->count() <= 0) r.fail("capacity", std::string(kExpected) + ", got \"" + text + "\"");
}

void read_per_table(config::ObjectReader r, EmbeddingCacheSpec& s) {
  const nlohmann::json& object = *r.document().find(r.path());
  for (const auto& [key, value] : object.items()) {
    std::size_t index = 0;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), index);
    if (ec != std::errc() || end != key.data() + key.size() || index > 1'000'000) {
      r.fail(key, "expected a table's index (0, 1, ...) as the key of its distribution");
    }
    if (s.per_table.size() <= index) s.per_table.resize(index + 1);
    s.per_table[index] = read_distribution(r.object(key, "an id distribution"));
  }
}

}  // namespace

EmbeddingCacheSpec read_embedding_cache(config::ObjectReader r) {
  EmbeddingCacheSpec s;
  read_capacity(r, s);
  const std::string policy = r.choice_or("policy", {"frequency", "lfu", "lru"}, "frequency");
  s.policy = policy == "lfu"   ? CachePolicy::lfu
             : policy == "lru" ? CachePolicy::lru
                               : CachePolicy::frequency;
  if (r.has("distribution")) {
    s.distribution = read_distribution(r.object("distribution", "an id distribution"));
  }
  if (r.has("per_table")) read_per_table(r.object("per_table", "distributions by table"), s);
  s.warmup_batches = r.integer_in_or("warmup_batches", 0, 1'000'000, s.warmup_batches);
  s.measure_batches = r.integer_in_or("measure_batches", 1, 1'000'000, s.measure_batches);
  s.max_lookups_per_batch =
      r.integer_in_or("max_lookups_per_batch", 1, std::numeric_limits<std::int32_t>::max() / 4,
                      s.max_lookups_per_batch);
  s.seed = static_cast<std::uint64_t>(r.integer_in_or(
      "seed", 0, std::numeric_limits<std::int64_t>::max(), static_cast<std::int64_t>(s.seed)));
  r.finish();
  return s;
}

}  // namespace stratasim::strategies
