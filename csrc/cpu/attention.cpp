// Paged decode attention on the CPU, reading K/V in place through the block
// table (no gather copy).
//
// Layout: key_cache / value_cache [num_blocks, block_size, num_kv_heads,
// head_size] (any strides on the first three dims, the last one contiguous);
// token t of sequence b lives in block block_table[b][t / block_size] at
// offset t % block_size. query / out [num_seqs, num_heads, head_size].
//
// Work split: one task per (sequence, kv head). The G = num_heads /
// num_kv_heads query heads that share a kv head are processed together, so
// every K/V row is read from memory once per task. Softmax is online
// ("flash" style) in fp32, one block at a time: scores of the block for the
// G heads, new running max, rescale of the accumulators, then P @ V.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "attention_fast.h"
#include "cpu_types.h"

namespace vllm_cpu {
namespace {

struct DecodeParams {
  int64_t num_heads, num_kv_heads, head_size, block_size;
  int64_t q_stride_seq, q_stride_head, o_stride_seq, o_stride_head;
  int64_t k_stride_block, k_stride_tok, k_stride_head;
  int64_t v_stride_block, v_stride_tok, v_stride_head;
  int64_t bt_stride;
  float scale, soft_cap;  // soft_cap <= 0: none
  int64_t sliding_window;  // <= 0: none
};

// Up to this head size the generic vector path keeps a whole K / V row in
// registers (16 zmm or 32 ymm: spilled to L1 past 16 ymm, still one load
// and conversion per element per row instead of one per head).
constexpr int64_t kMaxVecHead = 256;

// Dot products of the G query rows (fp32, pre-scaled) with one key row.
// Vector over the first d - d % kLanes channels, scalar over the rest.
template <typename T>
inline void qk_row(const float* q, const T* k, int64_t g_count, int64_t d, float* out,
                   int64_t out_stride) {
  int64_t dv = 0;  // channels done by the vector part
#ifdef VLLM_CPU_SIMD
  using namespace simd;
  fvec kv[kMaxVecHead / kLanes];
  if (d >= kLanes && d <= kMaxVecHead) {
    dv = d - d % kLanes;
    for (int64_t c = 0; c < dv / kLanes; ++c) kv[c] = load(k + c * kLanes);
  }
#endif
  for (int64_t g = 0; g < g_count; ++g) {
    const float* qg = q + g * d;
    float s = 0.f;
#ifdef VLLM_CPU_SIMD
    if (dv > 0) {
      fvec acc = mul(load(qg), kv[0]);
      for (int64_t c = 1; c < dv / kLanes; ++c) acc = fmadd(load(qg + c * kLanes), kv[c], acc);
      s = hsum(acc);
    }
#endif
    for (int64_t i = dv; i < d; ++i) s += qg[i] * to_float(k[i]);
    out[g * out_stride] = s;
  }
}

// acc[g] += p[g] * v for the G heads.
template <typename T>
inline void pv_row(const float* p, int64_t p_stride, const T* v, int64_t g_count, int64_t d,
                   float* acc) {
  int64_t dv = 0;
#ifdef VLLM_CPU_SIMD
  using namespace simd;
  if (d >= kLanes && d <= kMaxVecHead) {
    dv = d - d % kLanes;
    fvec vv[kMaxVecHead / kLanes];
    for (int64_t c = 0; c < dv / kLanes; ++c) vv[c] = load(v + c * kLanes);
    for (int64_t g = 0; g < g_count; ++g) {
      const fvec pg = set1(p[g * p_stride]);
      float* ag = acc + g * d;
      for (int64_t c = 0; c < dv / kLanes; ++c)
        store(ag + c * kLanes, fmadd(pg, vv[c], load(ag + c * kLanes)));
    }
  }
#endif
  for (int64_t g = 0; g < g_count; ++g) {
    const float pg = p[g * p_stride];
    for (int64_t i = dv; i < d; ++i) acc[g * d + i] += pg * to_float(v[i]);
  }
}

// exp(x - m) in place over n scores; returns their sum.
inline float exp_sum(float* x, int64_t n, float m) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef VLLM_CPU_SIMD
  using namespace simd;
  const fvec vm = set1(m);
  fvec vs = zero();
  for (; i + kLanes <= n; i += kLanes) {
    fvec e = exp(sub(load(x + i), vm));
    store(x + i, e);
    vs = add(vs, e);
  }
  sum = hsum(vs);
#endif
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  return sum;
}

// Software prefetch of a block's rows for one kv head: blocks are scattered
// in memory, so the hardware prefetcher cannot see the next one coming
// (measured: ~2 GB/s per core on DRAM-resident caches without this).
template <typename T>
inline void prefetch_rows(const T* base, int64_t rows, int64_t row_stride, int64_t d) {
  const int64_t bytes = d * static_cast<int64_t>(sizeof(T));
  for (int64_t r = 0; r < rows; ++r) {
    const char* row = reinterpret_cast<const char*>(base + r * row_stride);
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off, 0, 3);
  }
}

template <typename T, typename IdxT>
void decode_one(const DecodeParams& p, const T* query, const T* key_cache, const T* value_cache,
                const IdxT* block_table, int64_t seq_len, T* out, int64_t b, int64_t kvh,
                std::vector<float>& buf) {
  const int64_t g_count = p.num_heads / p.num_kv_heads, d = p.head_size, bs = p.block_size;
  buf.resize(g_count * d * 2 + g_count * bs);
  float* q = buf.data();           // [G, D] scaled query
  float* acc = q + g_count * d;    // [G, D] running P @ V
  float* s = acc + g_count * d;    // [G, BS] scores of the current block
  const float qscale = p.soft_cap > 0 ? 1.f : p.scale;
  for (int64_t g = 0; g < g_count; ++g) {
    const T* qg = query + b * p.q_stride_seq + (kvh * g_count + g) * p.q_stride_head;
    for (int64_t i = 0; i < d; ++i) q[g * d + i] = to_float(qg[i]) * qscale;
  }
  std::fill(acc, acc + g_count * d, 0.f);
  std::vector<float> run_max(g_count, -std::numeric_limits<float>::infinity());
  std::vector<float> run_sum(g_count, 0.f);
  const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, seq_len - p.sliding_window) : 0;
  for (int64_t blk = first / bs; blk * bs < seq_len; ++blk) {
    const int64_t block_id = static_cast<int64_t>(block_table[blk]);
    const int64_t lo = std::max(first, blk * bs) - blk * bs;
    const int64_t hi = std::min(seq_len, (blk + 1) * bs) - blk * bs;
    const int64_t n = hi - lo;
    const T* kb = key_cache + block_id * p.k_stride_block + kvh * p.k_stride_head;
    const T* vb = value_cache + block_id * p.v_stride_block + kvh * p.v_stride_head;
    if ((blk + 1) * bs < seq_len) {
      const int64_t next = static_cast<int64_t>(block_table[blk + 1]);
      prefetch_rows(key_cache + next * p.k_stride_block + kvh * p.k_stride_head, bs, p.k_stride_tok, d);
      prefetch_rows(value_cache + next * p.v_stride_block + kvh * p.v_stride_head, bs, p.v_stride_tok, d);
    }
    for (int64_t t = lo; t < hi; ++t) qk_row(q, kb + t * p.k_stride_tok, g_count, d, s + (t - lo), bs);
    for (int64_t g = 0; g < g_count; ++g) {
      float* sg = s + g * bs;
      if (p.soft_cap > 0) {
        for (int64_t t = 0; t < n; ++t) sg[t] = p.soft_cap * std::tanh(sg[t] * p.scale / p.soft_cap);
      }
      const float bmax = *std::max_element(sg, sg + n);
      const float new_max = std::max(run_max[g], bmax);
      const float rescale = std::exp(run_max[g] - new_max);  // exp(-inf) = 0 on the first block
      run_sum[g] = run_sum[g] * rescale + exp_sum(sg, n, new_max);
      run_max[g] = new_max;
      if (rescale != 1.f) {
        for (int64_t i = 0; i < d; ++i) acc[g * d + i] *= rescale;
      }
    }
    for (int64_t t = lo; t < hi; ++t) pv_row(s + (t - lo), bs, vb + t * p.v_stride_tok, g_count, d, acc);
  }
  for (int64_t g = 0; g < g_count; ++g) {
    T* og = out + b * p.o_stride_seq + (kvh * g_count + g) * p.o_stride_head;
    const float inv = run_sum[g] > 0 ? 1.f / run_sum[g] : 0.f;
    for (int64_t i = 0; i < d; ++i) og[i] = from_float<T>(acc[g * d + i] * inv);
  }
}

#ifdef VLLM_CPU_SIMD
// decode_one on the fast path (attention_fast.h): head size D, block size a
// multiple of the vector width.
template <typename T, typename IdxT, int D>
void decode_one_fast(const DecodeParams& p, const T* query, const T* key_cache,
                     const T* value_cache, const IdxT* block_table, int64_t seq_len, T* out,
                     int64_t b, int64_t kvh, std::vector<float>& buf) {
  const int64_t g_count = p.num_heads / p.num_kv_heads, bs = p.block_size;
  buf.resize(g_count * D + g_count * bs + bs * D + 2 * g_count);
  float* acc = buf.data();            // [G, D]
  float* scores = acc + g_count * D;  // [G, BS]
  float* vf = scores + g_count * bs;  // [BS, D] fp32 V rows
  float* m = vf + bs * D;
  float* l = m + g_count;
  QueryRow<T, D> q[64];
  for (int64_t g = 0; g < g_count; ++g) {
    q[g].load(query + b * p.q_stride_seq + (kvh * g_count + g) * p.q_stride_head);
    m[g] = -INFINITY;
    l[g] = 0.f;
  }
  std::fill(acc, acc + g_count * D, 0.f);
  const FastParams fp{g_count, bs, p.k_stride_tok, p.v_stride_tok, p.scale, p.soft_cap};
  const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, seq_len - p.sliding_window) : 0;
  for (int64_t blk = first / bs; blk * bs < seq_len; ++blk) {
    const int64_t block_id = static_cast<int64_t>(block_table[blk]);
    if ((blk + 1) * bs < seq_len) {
      const int64_t next = static_cast<int64_t>(block_table[blk + 1]);
      prefetch_rows(key_cache + next * p.k_stride_block + kvh * p.k_stride_head, bs, p.k_stride_tok, D);
      prefetch_rows(value_cache + next * p.v_stride_block + kvh * p.v_stride_head, bs, p.v_stride_tok, D);
    }
    const int64_t lo = std::max(first, blk * bs) - blk * bs;
    const int64_t hi = std::min(seq_len, (blk + 1) * bs) - blk * bs;
    fast_block<T, D>(fp, q, key_cache + block_id * p.k_stride_block + kvh * p.k_stride_head,
                     value_cache + block_id * p.v_stride_block + kvh * p.v_stride_head,
                     lo, hi, m, l, acc, scores, vf);
  }
  for (int64_t g = 0; g < g_count; ++g) {
    T* og = out + b * p.o_stride_seq + (kvh * g_count + g) * p.o_stride_head;
    const simd::fvec inv = simd::set1(l[g] > 0 ? 1.f / l[g] : 0.f);
    for (int c = 0; c < D / simd::kLanes; ++c)
      simd::store(og + c * simd::kLanes, simd::mul(simd::load(acc + g * D + c * simd::kLanes), inv));
  }
}
#endif

template <typename T, typename IdxT>
void decode_all(const DecodeParams& p, const at::Tensor& query, const at::Tensor& key_cache,
                const at::Tensor& value_cache, const at::Tensor& block_table,
                const at::Tensor& seq_lens, at::Tensor& out) {
  const int64_t num_seqs = query.size(0), hkv = p.num_kv_heads;
  const T* q = query.data_ptr<T>();
  const T* kc = key_cache.data_ptr<T>();
  const T* vc = value_cache.data_ptr<T>();
  const IdxT* bt = block_table.data_ptr<IdxT>();
  const auto lens = seq_lens.to(at::kLong);
  const int64_t* len = lens.data_ptr<int64_t>();
  T* o = out.data_ptr<T>();
  auto one = &decode_one<T, IdxT>;
#ifdef VLLM_CPU_SIMD
  const bool fast_ok = p.block_size % simd::kLanes == 0 && p.num_heads / hkv <= 64;
  if (fast_ok && p.head_size == 64) one = &decode_one_fast<T, IdxT, 64>;
  if (fast_ok && p.head_size == 128) one = &decode_one_fast<T, IdxT, 128>;
#endif
  at::parallel_for(0, num_seqs * hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buf;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / hkv, kvh = task % hkv;
      one(p, q, kc, vc, bt + b * p.bt_stride, len[b], o, b, kvh, buf);
    }
  });
}

}  // namespace

void paged_attention_decode(at::Tensor& out, const at::Tensor& query,
                            const at::Tensor& key_cache, const at::Tensor& value_cache,
                            const at::Tensor& block_table, const at::Tensor& seq_lens,
                            double scale, int64_t sliding_window, double soft_cap) {
  TORCH_CHECK(query.dim() == 3 && out.dim() == 3, "query/out must be [num_seqs, num_heads, head_size]");
  TORCH_CHECK(key_cache.dim() == 4 && value_cache.dim() == 4,
              "key/value cache must be [num_blocks, block_size, num_kv_heads, head_size]");
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1 && key_cache.stride(3) == 1 &&
                  value_cache.stride(3) == 1, "head_size dim must be contiguous");
  TORCH_CHECK(query.scalar_type() == key_cache.scalar_type() &&
                  out.scalar_type() == query.scalar_type() &&
                  value_cache.scalar_type() == key_cache.scalar_type(), "dtype mismatch");
  TORCH_CHECK(block_table.dim() == 2 && block_table.stride(1) == 1, "block_table must be [num_seqs, max_blocks]");
  TORCH_CHECK(query.size(1) % key_cache.size(2) == 0, "num_heads must be a multiple of num_kv_heads");
  DecodeParams p{query.size(1), key_cache.size(2), query.size(2), key_cache.size(1),
                 query.stride(0), query.stride(1), out.stride(0), out.stride(1),
                 key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
                 value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
                 block_table.stride(0), static_cast<float>(scale), static_cast<float>(soft_cap),
                 sliding_window};
  const bool idx64 = block_table.scalar_type() == at::kLong;
  TORCH_CHECK(idx64 || block_table.scalar_type() == at::kInt, "block_table must be int32/int64");
  switch (query.scalar_type()) {
    case at::kBFloat16:
      idx64 ? decode_all<bf16, int64_t>(p, query, key_cache, value_cache, block_table, seq_lens, out)
            : decode_all<bf16, int32_t>(p, query, key_cache, value_cache, block_table, seq_lens, out);
      break;
    case at::kHalf:
      idx64 ? decode_all<fp16, int64_t>(p, query, key_cache, value_cache, block_table, seq_lens, out)
            : decode_all<fp16, int32_t>(p, query, key_cache, value_cache, block_table, seq_lens, out);
      break;
    case at::kFloat:
      idx64 ? decode_all<float, int64_t>(p, query, key_cache, value_cache, block_table, seq_lens, out)
            : decode_all<float, int32_t>(p, query, key_cache, value_cache, block_table, seq_lens, out);
      break;
    default:
      TORCH_CHECK(false, "paged_attention_decode: fp32, bf16 or fp16 only, got ", query.scalar_type());
  }
}

}  // namespace vllm_cpu
