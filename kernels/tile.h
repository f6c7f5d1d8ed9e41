/* tile.h: the small matrix products of the attention tiles, with a row's bits its own.
 *
 * OpenBLAS's Haswell kernels (what it runs on every AVX2 CPU, and on AMD's AVX-512 ones) give a
 * row of a product other bits where it sits at another place among the rows, or with another
 * thread count (measured with Debian's 0.3.21, 2026-12-05). A prompt's rows land at other places
 * of a tile when the prompt is cut in other chunks, so a cache would change its answers. These
 * products compute every element as one chain of fused multiply-adds over k in order, from zero:
 * the same bits at any place, beside any rows, on any thread, at every instruction-set level. */
#ifndef FOCUS_TILE_H
#define FOCUS_TILE_H

#include "common.h"

/* C (m x n, ldc) = alpha (A B^T) for A (m x k, lda) and B (n x k, ldb), both row-major; only
 * the rows that rows lists (nrows of them; rows NULL: 0 .. m - 1). bt: scratch of k * n. */
void tile_abt(real* C, int ldc, const real* A, int lda, const real* B, int ldb, int m, int n, int k,
              real alpha, const int* rows, int nrows, real* bt);

/* C (m x n, ldc) = A B (accumulate 0) or C + A B (accumulate 1) for A (m x k, lda) and B (k x n,
 * ldb); only the rows listed, as tile_abt. */
void tile_ab(real* C, int ldc, const real* A, int lda, const real* B, int ldb, int m, int n, int k,
             int accumulate, const int* rows, int nrows);

#endif
