/* kern_attention_impl.h — the attention kernels of kern_attention.c for one
 * element type, included once per type: ATT_T (float, double), ATT_F32 (1 for float), ATT_FN(name)
 * (name_f32, name_f64) and ATT_GEMM (the vm_blas member).  Accumulators
 * are ATT_T: f32 attention sums in f32, as the composite's matmul and
 * softmax do. */

/* C[m x n] (ldc) = op(A) @ op(B) + beta * C, row-major; k == 0 leaves
   beta * C (BLAS wants ld >= 1, which an empty dim does not give) */
static void ATT_FN(gemm)(att_job *j, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                         const ATT_T *a, int64_t lda, const ATT_T *b, int64_t ldb, ATT_T beta,
                         ATT_T *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t r = 0; r < m; r++)
      for (int64_t q = 0; q < n; q++) c[r * ldc + q] = beta == 0 ? 0 : c[r * ldc + q] * beta;
    return;
  }
  atomic_fetch_add_explicit(&j->gemms, 1, memory_order_relaxed);
  j->blas->ATT_GEMM(VM_BLAS_ROW_MAJOR, ta ? VM_BLAS_TRANS : VM_BLAS_NO_TRANS,
                    tb ? VM_BLAS_TRANS : VM_BLAS_NO_TRANS, (int)m, (int)n, (int)k, 1, a,
                    (int)(lda > 1 ? lda : 1), b, (int)(ldb > 1 ? ldb : 1), beta, c,
                    (int)(ldc > 1 ? ldc : 1));
}

/* dst[rows x cols] = operand o's rows [row0, row0 + rows) of batch item bh
   (rounded to bf16 when o says so) */
static void ATT_FN(pack)(ATT_T *dst, const att_job *j, const att_operand *o, int64_t bh,
                         int64_t row0, int64_t rows, int64_t cols) {
  const ATT_T *src = (const ATT_T *)o->base + batch_offset(j, o, bh) + row0 * o->r;
  for (int64_t r = 0; r < rows; r++, dst += cols, src += o->r)
    if (o->round)
      for (int64_t c = 0; c < cols; c++) dst[c] = (ATT_T)vm_round_bf16((float)src[c * o->c]);
    else if (o->c == 1)
      memcpy(dst, src, (size_t)cols * sizeof(ATT_T));
    else
      for (int64_t c = 0; c < cols; c++) dst[c] = src[c * o->c];
}

/* rows [row0, row0 + rows) of operand o's batch item bh as a BLAS operand:
   o itself where its rows are unit-stride (*ld its row stride), else
   packed into buf (*ld = cols) */
static const ATT_T *ATT_FN(rows_of)(ATT_T *buf, const att_job *j, const att_operand *o, int64_t bh,
                                    int64_t row0, int64_t rows, int64_t cols, int64_t *ld) {
  if (!o->round && o->c == 1 && o->r >= cols && rows > 0) {
    *ld = o->r;
    return (const ATT_T *)o->base + batch_offset(j, o, bh) + row0 * o->r;
  }
  ATT_FN(pack)(buf, j, o, bh, row0, rows, cols);
  *ld = cols;
  return buf;
}

/* lane-order folds (16 lanes, then the lanes in order): vector code
   without reassociating a sequential sum */
static inline ATT_T ATT_FN(row_max)(const ATT_T *x, int64_t n) {
  ATT_T m[ATT_LANES];
  for (int l = 0; l < ATT_LANES; l++) m[l] = -(ATT_T)INFINITY;
  int64_t i = 0;
  for (; i + ATT_LANES <= n; i += ATT_LANES)
    for (int l = 0; l < ATT_LANES; l++) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
  for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
  ATT_T r = m[0];
  for (int l = 1; l < ATT_LANES; l++) r = m[l] > r ? m[l] : r;
  return r;
}
static inline ATT_T ATT_FN(row_sum)(const ATT_T *x, int64_t n) {
  ATT_T a[ATT_LANES] = {0};
  int64_t i = 0;
  for (; i + ATT_LANES <= n; i += ATT_LANES)
    for (int l = 0; l < ATT_LANES; l++) a[l] += x[i + l];
  for (; i < n; i++) a[0] += x[i];
  ATT_T r = a[0];
  for (int l = 1; l < ATT_LANES; l++) r += a[l];
  return r;
}
static inline ATT_T ATT_FN(row_dot)(const ATT_T *x, const ATT_T *y, int64_t n) {
  ATT_T a[ATT_LANES] = {0};
  int64_t i = 0;
  for (; i + ATT_LANES <= n; i += ATT_LANES)
    for (int l = 0; l < ATT_LANES; l++) a[l] += x[i + l] * y[i + l];
  for (; i < n; i++) a[0] += x[i] * y[i];
  ATT_T r = a[0];
  for (int l = 1; l < ATT_LANES; l++) r += a[l];
  return r;
}

/* S[rows x cols] (rows ld apart; query rows from i0, keys from j0) scaled
   and masked in place: masked-out scores are -inf; mx[r] = each row's max */
static void ATT_FN(scores)(const att_job *j, ATT_T *S, int64_t ld, int64_t rows, int64_t cols,
                           int64_t bh, int64_t i0, int64_t j0, ATT_T *mx) {
  const ATT_T scale = (ATT_T)j->scale, ninf = -(ATT_T)INFINITY;
  const char *mbase = NULL;
  if (j->has_mask)
    mbase = j->mask.base + (batch_offset(j, &j->mask, bh) + i0 * j->mask.r + j0 * j->mask.c) *
                               (int64_t)(j->mask_bool ? 1 : sizeof(ATT_T));
  for (int64_t r = 0; r < rows; r++) {
    ATT_T *s = S + r * ld;
    for (int64_t c = 0; c < cols; c++) s[c] *= scale;
    if (mbase && j->mask_bool) {
      const uint8_t *mk = (const uint8_t *)mbase + r * j->mask.r;
      for (int64_t c = 0; c < cols; c++) s[c] = mk[c * j->mask.c] ? s[c] : ninf;
    } else if (mbase) {
      const ATT_T *mk = (const ATT_T *)mbase + r * j->mask.r;
      for (int64_t c = 0; c < cols; c++) s[c] += mk[c * j->mask.c];
    }
    if (j->causal) /* keys past the query's position */
      for (int64_t c = i0 + r + 1 - j0 < 0 ? 0 : i0 + r + 1 - j0; c < cols; c++) s[c] = ninf;
    mx[r] = ATT_FN(row_max)(s, cols);
  }
}

/* S[r][c] -= shift[r]; P = exp(S); a score of -inf (masked) gives exactly
   0.  Rows of S and P are ld apart: one run of rows * cols where ld is
   cols, else row by row */
static void ATT_FN(exp_block)(const att_job *j, ATT_T *P, ATT_T *S, int64_t ld, int64_t rows,
                              int64_t cols, const ATT_T *shift) {
  for (int64_t r = 0; r < rows; r++) {
    ATT_T *s = S + r * ld, sh = shift[r];
    for (int64_t c = 0; c < cols; c++) s[c] -= sh;
  }
  int64_t runs = ld == cols ? 1 : rows, n = ld == cols ? rows * cols : cols;
  for (int64_t q = 0; q < runs; q++) {
    ATT_T *p = P + q * ld, *s = S + q * ld;
#if ATT_F32
    char *ptrs[2] = {(char *)p, (char *)s};
    j->exp_row(NULL, ptrs, (const int64_t[]){1, 1}, n);
#else
    (void)j;
    for (int64_t i = 0; i < n; i++) p[i] = exp(s[i]);
#endif
    for (int64_t i = 0; i < n; i++) p[i] = s[i] == -(ATT_T)INFINITY ? 0 : p[i];
  }
}

/* the shift a row's scores are exponentiated against: its max, or 0 when
   every score so far is masked (-inf - -inf would be NaN) */
static ATT_T ATT_FN(shift_of)(ATT_T m) { return m == -(ATT_T)INFINITY ? 0 : m; }

/* one key block [j0, j0 + cols) of a query block's online softmax, for
   the forward and the backward's first pass alike: S = Q K_blkᵀ scaled and
   masked, each row's max m and sum l brought up to date (alpha[r]: the
   factor the earlier blocks' terms shrink by), P = exp(S - m) */
static void ATT_FN(online_block)(att_job *j, const ATT_T *Q, int64_t ldq, const ATT_T *K,
                                 int64_t ldk, int64_t rows, int64_t cols, int64_t bh, int64_t i0,
                                 int64_t j0, ATT_T *S, ATT_T *P, ATT_T *m, ATT_T *l, ATT_T *mx,
                                 ATT_T *alpha) {
  ATT_FN(gemm)(j, false, true, rows, cols, j->d, Q, ldq, K + j0 * ldk, ldk, 0, S, cols);
  ATT_FN(scores)(j, S, cols, rows, cols, bh, i0, j0, mx);
  for (int64_t r = 0; r < rows; r++) {
    ATT_T mnew = mx[r] > m[r] ? mx[r] : m[r];
    alpha[r] = m[r] == -(ATT_T)INFINITY ? 0 : (ATT_T)exp(m[r] - mnew);
    m[r] = mnew;
    mx[r] = ATT_FN(shift_of)(mnew);
  }
  ATT_FN(exp_block)(j, P, S, cols, rows, cols, mx);
  for (int64_t r = 0; r < rows; r++) l[r] = l[r] * alpha[r] + ATT_FN(row_sum)(P + r * cols, cols);
}

/* forward tasks [begin, end): task = batch item * qblocks + query block */
ATT_CLONES static bool ATT_FN(forward_range)(att_job *j, int64_t begin, int64_t end) {
  const int64_t BQ = min64(ATT_BQ, j->tq), BK = min64(ATT_BK, j->tk), d = j->d, dv = j->dv;
  size_t n = (size_t)(BQ * d + 2 * BQ * BK + BQ * dv + 4 * BQ + j->tk * (d + dv));
  ATT_T *Qb = malloc((n ? n : 1) * sizeof(ATT_T));
  if (!Qb) return false;
  ATT_T *S = Qb + BQ * d, *P = S + BQ * BK, *acc = P + BQ * BK, *m = acc + BQ * dv, *l = m + BQ;
  ATT_T *mx = l + BQ, *alpha = mx + BQ, *Kb = alpha + BQ, *Vb = Kb + j->tk * d;
  int64_t at = -1, ldq, ldk = d, ldv = dv; /* at: the batch item K and V are of */
  const ATT_T *K = NULL, *V = NULL;
  for (int64_t task = begin; task < end; task++) {
    int64_t bh = task / j->qblocks, i0 = task % j->qblocks * BQ;
    int64_t rows = min64(BQ, j->tq - i0), kend = keys_end(j, i0, rows);
    if (at != bh) {
      K = ATT_FN(rows_of)(Kb, j, &j->k, bh, 0, j->tk, d, &ldk);
      V = ATT_FN(rows_of)(Vb, j, &j->v, bh, 0, j->tk, dv, &ldv);
      at = bh;
    }
    const ATT_T *Q = ATT_FN(rows_of)(Qb, j, &j->q, bh, i0, rows, d, &ldq);
    for (int64_t r = 0; r < rows; r++) m[r] = -(ATT_T)INFINITY, l[r] = 0;
    memset(acc, 0, (size_t)(rows * dv) * sizeof(ATT_T));
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
      int64_t cols = min64(BK, kend - j0);
      ATT_FN(online_block)(j, Q, ldq, K, ldk, rows, cols, bh, i0, j0, S, P, m, l, mx, alpha);
      for (int64_t r = 0; j0 > 0 && r < rows; r++) /* the earlier blocks' terms shrink */
        if (alpha[r] != 1)
          for (int64_t c = 0; c < dv; c++) acc[r * dv + c] *= alpha[r];
      ATT_FN(gemm)(j, false, false, rows, dv, cols, P, cols, V + j0 * ldv, ldv, 1, acc, dv);
    }
    ATT_T *o = (ATT_T *)j->out + (bh * j->tq + i0) * dv;
    for (int64_t r = 0; r < rows; r++) {
      ATT_T inv = l[r] > 0 ? 1 / l[r] : 0; /* no key: 0 */
      for (int64_t c = 0; c < dv; c++) o[r * dv + c] = acc[r * dv + c] * inv;
    }
  }
  free(Qb);
  return true;
}

/* P's rows divided by their sums l (a row with no key: 0) */
static void ATT_FN(scale_rows)(ATT_T *P, int64_t rows, int64_t cols, const ATT_T *l) {
  for (int64_t r = 0; r < rows; r++) {
    ATT_T inv = l[r] > 0 ? 1 / l[r] : 0;
    for (int64_t c = 0; c < cols; c++) P[r * cols + c] *= inv;
  }
}

/* The backward's pass 1 over query block (i0, rows): each row's running
   max m and sum l over its keys [0, kend) (online_block; where the keys
   are one block, P is left holding exp(S - m)), and D = rowsum(dO ∘ O). */
static void ATT_FN(row_stats)(att_job *j, const ATT_T *Q, int64_t ldq, const ATT_T *K, int64_t ldk,
                              const ATT_T *dO, int64_t lddo, const ATT_T *O, int64_t ldo,
                              int64_t rows, int64_t kend, int64_t bh, int64_t i0, ATT_T *S,
                              ATT_T *P, ATT_T *m, ATT_T *l, ATT_T *D, ATT_T *mx, ATT_T *alpha) {
  const int64_t BK = min64(ATT_BK, j->tk);
  for (int64_t r = 0; r < rows; r++) {
    D[r] = ATT_FN(row_dot)(dO + r * lddo, O + r * ldo, j->dv);
    m[r] = -(ATT_T)INFINITY, l[r] = 0;
  }
  for (int64_t j0 = 0; j0 < kend; j0 += BK) ATT_FN(online_block)
  (j, Q, ldq, K, ldk, rows, min64(BK, kend - j0), bh, i0, j0, S, P, m, l, mx, alpha);
}

/* pass 2's probabilities of query block (i0, rows) x key block (j0, cols)
   from pass 1's m and l: exp(S - lse), or, where the query block's keys
   are one block, exp(S - m) / l (what pass 1 left in P, recomputed) */
static void ATT_FN(probs)(att_job *j, const ATT_T *Q, int64_t ldq, const ATT_T *K, int64_t ldk,
                          int64_t rows, int64_t cols, int64_t bh, int64_t i0, int64_t j0,
                          bool one_block, const ATT_T *m, const ATT_T *l, ATT_T *S, ATT_T *P,
                          ATT_T *shift) {
  ATT_FN(gemm)(j, false, true, rows, cols, j->d, Q, ldq, K + j0 * ldk, ldk, 0, S, cols);
  ATT_FN(scores)(j, S, cols, rows, cols, bh, i0, j0, shift);
  for (int64_t r = 0; r < rows; r++) /* a row with lse -inf has every score -inf: P = 0 */
    shift[r] = one_block  ? ATT_FN(shift_of)(m[r])
               : l[r] > 0 ? ATT_FN(shift_of)(m[r]) + (ATT_T)log(l[r])
                          : 0;
  ATT_FN(exp_block)(j, P, S, cols, rows, cols, shift);
  if (one_block) ATT_FN(scale_rows)(P, rows, cols, l);
}

/* dS = P ∘ (dP - D) · scale, into dP */
static void ATT_FN(dscores)(const att_job *j, const ATT_T *P, ATT_T *dP, int64_t rows, int64_t cols,
                            const ATT_T *D) {
  const ATT_T scale = (ATT_T)j->scale;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      dP[r * cols + c] = P[r * cols + c] * (dP[r * cols + c] - D[r]) * scale;
}

/* The backward by batch item (a task is one item: its dK, dV accumulate
   over its query blocks without other writers); out = dq | dk | dv */
ATT_CLONES static bool ATT_FN(backward_range)(att_job *j, int64_t begin, int64_t end) {
  const int64_t BQ = min64(ATT_BQ, j->tq), BK = min64(ATT_BK, j->tk), d = j->d, dv = j->dv;
  const int64_t tk = j->tk;
  size_t n = (size_t)(BQ * d + 2 * BQ * dv + 3 * BQ * BK + 6 * BQ + tk * (d + dv));
  ATT_T *Qb = malloc((n ? n : 1) * sizeof(ATT_T));
  if (!Qb) return false;
  ATT_T *dOb = Qb + BQ * d, *Ob = dOb + BQ * dv, *S = Ob + BQ * dv, *P = S + BQ * BK;
  ATT_T *dP = P + BQ * BK, *m = dP + BQ * BK, *l = m + BQ, *mx = l + BQ, *shift = mx + BQ;
  ATT_T *D = shift + BQ, *alpha = D + BQ, *Kb = alpha + BQ, *Vb = Kb + tk * d;
  int64_t qn = j->nbatch * j->tq * d, kn = j->nbatch * tk * d, ldq, ldk, ldv, lddo, ldo;
  for (int64_t bh = begin; bh < end; bh++) {
    ATT_T *dq = (ATT_T *)j->out + bh * j->tq * d, *dk = (ATT_T *)j->out + qn + bh * tk * d;
    ATT_T *dvv = (ATT_T *)j->out + qn + kn + bh * tk * dv;
    const ATT_T *K = ATT_FN(rows_of)(Kb, j, &j->k, bh, 0, tk, d, &ldk);
    const ATT_T *V = ATT_FN(rows_of)(Vb, j, &j->v, bh, 0, tk, dv, &ldv);
    memset(dq, 0, (size_t)(j->tq * d) * sizeof(ATT_T));
    memset(dk, 0, (size_t)(tk * d) * sizeof(ATT_T));
    memset(dvv, 0, (size_t)(tk * dv) * sizeof(ATT_T));
    for (int64_t i0 = 0; i0 < j->tq; i0 += BQ) {
      int64_t rows = min64(BQ, j->tq - i0), kend = keys_end(j, i0, rows);
      bool one_block = kend <= BK; /* pass 1's probabilities serve pass 2 */
      const ATT_T *Q = ATT_FN(rows_of)(Qb, j, &j->q, bh, i0, rows, d, &ldq);
      const ATT_T *dO = ATT_FN(rows_of)(dOb, j, &j->dout, bh, i0, rows, dv, &lddo);
      const ATT_T *O = ATT_FN(rows_of)(Ob, j, &j->o, bh, i0, rows, dv, &ldo);
      ATT_FN(row_stats)
      (j, Q, ldq, K, ldk, dO, lddo, O, ldo, rows, kend, bh, i0, S, P, m, l, D, mx, alpha);
      for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        int64_t cols = min64(BK, kend - j0);
        if (one_block) /* P holds exp(S - m): divide by l */
          ATT_FN(scale_rows)(P, rows, cols, l);
        else
          ATT_FN(probs)(j, Q, ldq, K, ldk, rows, cols, bh, i0, j0, false, m, l, S, P, shift);
        ATT_FN(gemm)(j, true, false, cols, dv, rows, P, cols, dO, lddo, 1, dvv + j0 * dv, dv);
        ATT_FN(gemm)(j, false, true, rows, cols, dv, dO, lddo, V + j0 * ldv, ldv, 0, dP, cols);
        ATT_FN(dscores)(j, P, dP, rows, cols, D);
        ATT_FN(gemm)
        (j, false, false, rows, d, cols, dP, cols, K + j0 * ldk, ldk, 1, dq + i0 * d, d);
        ATT_FN(gemm)(j, true, false, cols, d, rows, dP, cols, Q, ldq, 1, dk + j0 * d, d);
      }
    }
  }
  free(Qb);
  return true;
}

/* The backward in three phases, for few batch items on many threads: the
   same arithmetic as backward_range, in the same order for every sum, so
   the same bits, with the work spread over query and key blocks.  Phase 1
   (a task per query block): pass 1's m, l and D, kept in j->stats.  Then
   a task per key block accumulates its dK, dV over the query blocks in
   order, and a task per query block its dQ over the key blocks in order;
   each recomputes the probabilities it needs (a query block's scores are
   computed three times, not twice). */
ATT_CLONES static bool ATT_FN(stats_range)(att_job *j, int64_t begin, int64_t end) {
  const int64_t BQ = min64(ATT_BQ, j->tq), BK = min64(ATT_BK, j->tk), d = j->d, dv = j->dv;
  const int64_t tk = j->tk;
  size_t n = (size_t)(BQ * d + 2 * BQ * dv + 2 * BQ * BK + 2 * BQ + tk * d);
  ATT_T *Qb = scratch_get(j, (n ? n : 1) * sizeof(ATT_T));
  if (!Qb) return false;
  ATT_T *dOb = Qb + BQ * d, *Ob = dOb + BQ * dv, *S = Ob + BQ * dv, *P = S + BQ * BK;
  ATT_T *mx = P + BQ * BK, *alpha = mx + BQ, *Kb = alpha + BQ;
  int64_t at = -1, ldq, ldk = d, lddo, ldo;
  const ATT_T *K = NULL;
  for (int64_t task = begin; task < end; task++) {
    int64_t bh = task / j->qblocks, i0 = task % j->qblocks * BQ;
    int64_t rows = min64(BQ, j->tq - i0), kend = keys_end(j, i0, rows);
    if (at != bh) K = ATT_FN(rows_of)(Kb, j, &j->k, bh, 0, tk, d, &ldk), at = bh;
    const ATT_T *Q = ATT_FN(rows_of)(Qb, j, &j->q, bh, i0, rows, d, &ldq);
    const ATT_T *dO = ATT_FN(rows_of)(dOb, j, &j->dout, bh, i0, rows, dv, &lddo);
    const ATT_T *O = ATT_FN(rows_of)(Ob, j, &j->o, bh, i0, rows, dv, &ldo);
    ATT_T *st = (ATT_T *)j->stats + 3 * (bh * j->tq + i0);
    ATT_FN(row_stats)
    (j, Q, ldq, K, ldk, dO, lddo, O, ldo, rows, kend, bh, i0, S, P, st, st + rows, st + 2 * rows,
     mx, alpha);
  }
  scratch_put(j, Qb, (n ? n : 1) * sizeof(ATT_T));
  return true;
}

/* phase 2: tasks [0, nbatch * kblocks) are (item, key block): dK, dV;
   then (item, query block): dQ */
ATT_CLONES static bool ATT_FN(grads_range)(att_job *j, int64_t begin, int64_t end) {
  const int64_t BQ = min64(ATT_BQ, j->tq), BK = min64(ATT_BK, j->tk), d = j->d, dv = j->dv;
  const int64_t tk = j->tk, kv_tasks = j->nbatch * j->kblocks;
  size_t n = (size_t)(BQ * d + BQ * dv + 3 * BQ * BK + BQ + tk * (d + dv));
  ATT_T *Qb = scratch_get(j, (n ? n : 1) * sizeof(ATT_T));
  if (!Qb) return false;
  ATT_T *dOb = Qb + BQ * d, *S = dOb + BQ * dv, *P = S + BQ * BK, *dP = P + BQ * BK;
  ATT_T *shift = dP + BQ * BK, *Kb = shift + BQ, *Vb = Kb + tk * d;
  int64_t qn = j->nbatch * j->tq * d, kn = j->nbatch * tk * d, ldq, ldk = d, ldv = dv, lddo;
  int64_t at = -1;
  const ATT_T *K = NULL, *V = NULL;
  for (int64_t task = begin; task < end; task++) {
    bool kv = task < kv_tasks;
    int64_t bh = kv ? task / j->kblocks : (task - kv_tasks) / j->qblocks;
    if (at != bh) {
      K = ATT_FN(rows_of)(Kb, j, &j->k, bh, 0, tk, d, &ldk);
      V = ATT_FN(rows_of)(Vb, j, &j->v, bh, 0, tk, dv, &ldv);
      at = bh;
    }
    if (kv) { /* key block j0: dK, dV over the query blocks, in order */
      int64_t j0 = task % j->kblocks * BK;
      ATT_T *dk = (ATT_T *)j->out + qn + (bh * tk + j0) * d;
      ATT_T *dvv = (ATT_T *)j->out + qn + kn + (bh * tk + j0) * dv;
      memset(dk, 0, (size_t)(min64(BK, tk - j0) * d) * sizeof(ATT_T));
      memset(dvv, 0, (size_t)(min64(BK, tk - j0) * dv) * sizeof(ATT_T));
      for (int64_t i0 = 0; i0 < j->tq; i0 += BQ) {
        int64_t rows = min64(BQ, j->tq - i0), kend = keys_end(j, i0, rows);
        if (j0 >= kend) continue;
        int64_t cols = min64(BK, kend - j0);
        const ATT_T *st = (const ATT_T *)j->stats + 3 * (bh * j->tq + i0);
        const ATT_T *Q = ATT_FN(rows_of)(Qb, j, &j->q, bh, i0, rows, d, &ldq);
        const ATT_T *dO = ATT_FN(rows_of)(dOb, j, &j->dout, bh, i0, rows, dv, &lddo);
        ATT_FN(probs)
        (j, Q, ldq, K, ldk, rows, cols, bh, i0, j0, kend <= BK, st, st + rows, S, P, shift);
        ATT_FN(gemm)(j, true, false, cols, dv, rows, P, cols, dO, lddo, 1, dvv, dv);
        ATT_FN(gemm)(j, false, true, rows, cols, dv, dO, lddo, V + j0 * ldv, ldv, 0, dP, cols);
        ATT_FN(dscores)(j, P, dP, rows, cols, st + 2 * rows);
        ATT_FN(gemm)(j, true, false, cols, d, rows, dP, cols, Q, ldq, 1, dk, d);
      }
    } else { /* query block i0: dQ over the key blocks, in order */
      int64_t i0 = (task - kv_tasks) % j->qblocks * BQ;
      int64_t rows = min64(BQ, j->tq - i0), kend = keys_end(j, i0, rows);
      ATT_T *dq = (ATT_T *)j->out + (bh * j->tq + i0) * d;
      const ATT_T *st = (const ATT_T *)j->stats + 3 * (bh * j->tq + i0);
      const ATT_T *Q = ATT_FN(rows_of)(Qb, j, &j->q, bh, i0, rows, d, &ldq);
      const ATT_T *dO = ATT_FN(rows_of)(dOb, j, &j->dout, bh, i0, rows, dv, &lddo);
      memset(dq, 0, (size_t)(rows * d) * sizeof(ATT_T));
      for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        int64_t cols = min64(BK, kend - j0);
        ATT_FN(probs)
        (j, Q, ldq, K, ldk, rows, cols, bh, i0, j0, kend <= BK, st, st + rows, S, P, shift);
        ATT_FN(gemm)(j, false, true, rows, cols, dv, dO, lddo, V + j0 * ldv, ldv, 0, dP, cols);
        ATT_FN(dscores)(j, P, dP, rows, cols, st + 2 * rows);
        ATT_FN(gemm)(j, false, false, rows, d, cols, dP, cols, K + j0 * ldk, ldk, 1, dq, d);
      }
    }
  }
  scratch_put(j, Qb, (n ? n : 1) * sizeof(ATT_T));
  return true;
}
