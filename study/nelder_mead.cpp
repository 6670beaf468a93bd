#include "study/nelder_mead.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace stratasim::study {

Minimum nelder_mead(const std::function<double(const std::vector<double>&)>& f,
                    std::vector<double> x0, double step, int max_evaluations, double tol) {
  const std::size_t n = x0.size();
  std::vector<std::vector<double>> p(n + 1, x0);
  for (std::size_t i = 0; i < n; ++i) p[i + 1][i] += step;
  std::vector<double> v(n + 1);
  int evaluations = 0;
  auto eval = [&](const std::vector<double>& x) {
    ++evaluations;
    const double y = f(x);
    return std::isfinite(y) ? y : 1e300;
  };
  for (std::size_t i = 0; i <= n; ++i) v[i] = eval(p[i]);
  std::vector<std::size_t> order(n + 1);
  while (true) {
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return v[a] < v[b]; });
    const std::size_t best = order.front(), worst = order.back(), second = order[n - 1];
    double spread = 0;
    for (std::size_t i = 0; i <= n; ++i) {
      for (std::size_t d = 0; d < n; ++d) spread = std::max(spread, std::abs(p[i][d] - p[best][d]));
    }
    if (std::abs(v[worst] - v[best]) <= tol && spread <= 1e-7) return {p[best], v[best], true};
    if (evaluations >= max_evaluations) return {p[best], v[best], false};
    std::vector<double> centroid(n, 0);
    for (std::size_t i = 0; i <= n; ++i) {
      if (i == worst) continue;
      for (std::size_t d = 0; d < n; ++d) centroid[d] += p[i][d] / static_cast<double>(n);
    }
    auto along = [&](double t) {
      std::vector<double> x(n);
      for (std::size_t d = 0; d < n; ++d) x[d] = centroid[d] + t * (p[worst][d] - centroid[d]);
      return x;
    };
    const auto reflected = along(-1);
    const double fr = eval(reflected);
    if (fr < v[best]) {
      const auto expanded = along(-2);
      const double fe = eval(expanded);
      if (fe < fr) {
        p[worst] = expanded;
        v[worst] = fe;
      } else {
        p[worst] = reflected;
        v[worst] = fr;
      }
    } else if (fr < v[second]) {
      p[worst] = reflected;
      v[worst] = fr;
    } else {
      const auto contracted = fr < v[worst] ? along(-0.5) : along(0.5);
      const double fc = eval(contracted);
      if (fc < std::min(fr, v[worst])) {
        p[worst] = contracted;
        v[worst] = fc;
      } else {
        for (std::size_t i = 0; i <= n; ++i) {
          if (i == best) continue;
          for (std::size_t d = 0; d < n; ++d) p[i][d] = p[best][d] + 0.5 * (p[i][d] - p[best][d]);
          v[i] = eval(p[i]);
        }
      }
    }
  }
}

}  // namespace stratasim::study
