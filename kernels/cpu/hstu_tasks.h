// Work partitioning of the jagged HSTU attention (hstu_attention.h): tasks of (sequence, head, tile)
// or (sequence, head) with their cost in tile pairs, longest first, handed out dynamically to the
// workers of at::parallel_for; per-worker scratch.
#include "isa.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "hstu_tiles.h"

// once per path (isa.h): GRLIB_ISA_NS is the path's namespace
#if defined(GRLIB_ISA_NS) && !defined(GRLIB_HSTU_TASKS_H)
#define GRLIB_HSTU_TASKS_H
namespace GRLIB_ISA_NS::hstu {

struct Task {
  int64_t b, h, blk, cost;
};

// Every (sequence, head, tile) with its cost in tile pairs; `by_key` = cost of a key tile.
inline std::vector<Task> make_tasks(const int64_t* o, int64_t B, int64_t H, bool by_key) {
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = (o[b + 1] - o[b] + BLK - 1) / BLK;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H; ++h) tasks.push_back({b, h, t, by_key ? n - t : t + 1});
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.cost > b.cost; });
  return tasks;
}

// One task per (sequence, head) of a non-empty sequence, costing its tile pairs n (n + 1) / 2,
// longest first: the tasks of the one-pass backward.
inline std::vector<Task> sequence_tasks(const int64_t* o, int64_t B, int64_t H) {
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = (o[b + 1] - o[b] + BLK - 1) / BLK;
    if (n > 0)
      for (int64_t h = 0; h < H; ++h) tasks.push_back({b, h, 0, n * (n + 1) / 2});
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) { return x.cost > y.cost; });
  return tasks;
}

// Whether the (sequence, head) tasks can keep every worker busy: the costliest holds at most
// 1 / workers of the tile pairs (longest-first dynamic scheduling then balances them). Else a pass
// splits its work into tiles (e.g. one long sequence with one head).
inline bool sequence_tasks_balance(const std::vector<Task>& tasks) {
  int64_t total = 0;
  for (const Task& t : tasks) total += t.cost;
  return tasks.empty() || tasks.front().cost * at::get_num_threads() <= total;
}

// The longest of the B sequences of offsets o (the rows of a task's per-sequence scratch).
inline int64_t longest_sequence(const int64_t* o, int64_t B) {
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) longest = std::max(longest, o[b + 1] - o[b]);
  return longest;
}

// The forward's tasks: one per (sequence, head) when those balance over the workers
// (sequence_tasks_balance), else one per (sequence, head, query tile). A task's query tiles are
// [tile0, tile1) of its sequence of length L.
struct ForwardTasks {
  std::vector<Task> tasks;
  bool per_sequence;
  int64_t tile0(const Task& t) const { return per_sequence ? 0 : t.blk; }
  int64_t tile1(const Task& t, int64_t L) const { return per_sequence ? (L + BLK - 1) / BLK : t.blk + 1; }
};

inline ForwardTasks forward_tasks(const int64_t* o, int64_t B, int64_t H) {
  std::vector<Task> tasks = sequence_tasks(o, B, H);
  const bool per_sequence = sequence_tasks_balance(tasks);
  if (!per_sequence) tasks = make_tasks(o, B, H, /*by_key=*/false);
  return {std::move(tasks), per_sequence};
}

// Runs fn(worker, task) for every task, longest first, dynamically balanced over the workers of
// at::parallel_for (one index per worker; nested calls run serially on worker 0).
template <typename F>
void run_tasks(const std::vector<Task>& tasks, int64_t workers, const F& fn) {
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(tasks.size());
  at::parallel_for(0, workers, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w)
      for (int64_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) fn(w, tasks[t]);
  });
}

// Per-worker scratch of `n` elements each.
template <typename T>
std::vector<std::vector<T>> scratch(int64_t workers, int64_t n) {
  return std::vector<std::vector<T>>(workers, std::vector<T>(n));
}

// The calling thread's scratch of at least `n` elements, kept between calls and grown when a call needs
// more (never shrunk: a worker holds the largest it has needed). Not cleared: its users write every
// element they read. A fresh zeroed buffer per call (scratch above) cost the bf16 one-pass backward,
// whose dS of a sequence is [Lp, Lp] (32 MiB per worker at 4,096 tokens), its page faults and memset
// on every call.
template <typename T>
T* thread_scratch(int64_t n) {
  thread_local std::vector<T> buf;
  if (static_cast<int64_t>(buf.size()) < n) {
    buf.clear();
    buf.shrink_to_fit();
    buf.resize(n);
  }
  return buf.data();
}

}  // namespace GRLIB_ISA_NS::hstu
#endif
