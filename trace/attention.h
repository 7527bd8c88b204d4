/* attention.h — attention written the long way, recognized as it is
 * recorded (DESIGN §14): when matmul(p, v) is recorded and p is
 * kiln_softmax over the last axis of q kᵀ (times or divided by a scalar,
 * plus a float mask or filled with -inf where a bool mask says; a bool
 * mask comparing arange(Tk) with arange(Tq) as j > i is the causal flag), front/
 * records the attention primitive instead (fe_attention) and retires the
 * composite's nodes: they leave the pending graph as recomputable values,
 * so no flush computes them unless someone reads them, and no backward
 * keeps what their VJPs would have read.  In bf16 or f16 (written with
 * half tensors, or f32 under autocast) the casts the recording put
 * between the parts are part of the pattern: the op takes the half q, k
 * and v, computes in f32 and rounds its result once (fe_attention), where
 * the composite rounded the scores, the scaled scores and the
 * probabilities to the half dtype on the way.  The match is a function of the
 * recorded program alone (never of timing or of which handles are alive),
 * made whatever KILN_JIT says, so both modes run the same graph. */
#ifndef TR_ATTENTION_H
#define TR_ATTENTION_H

#include "../vm/tensor.h"

enum { TR_ATTENTION_CHAIN = 16 };

typedef struct tr_attention_match {
  vm_tensor *q, *kt; /* new handles: q [..., Tq, d], kᵀ [..., d, Tk] */
  vm_tensor *mask;   /* new handle or NULL: bool or float */
  /* new handles or NULL: the f32 values q, kᵀ and v were cast to bf16
     from (autocast's operands), when all three were */
  vm_tensor *q_f32, *kt_f32, *v_f32;
  bool mask_out; /* a bool mask that is true where scores are masked out */
  bool causal;   /* the bool mask was the causal one (mask is NULL) */
  double scale;
  int nchain;
  struct tr_node *chain[TR_ATTENTION_CHAIN]; /* the composite's nodes (references) */
} tr_attention_match;

/* whether p (the left operand of a matmul being recorded, whose right
   operand is v) is such a softmax; fills m (release it with
   tr_attention_match_free) */
bool tr_attention_match_of(vm_tensor *p, const vm_tensor *v, tr_attention_match *m);
/* the match's composite nodes that are still pending become recomputable
   (the fused op replaced their consumer); counts and logs the rewrite */
void tr_attention_retire(tr_attention_match *m);
void tr_attention_match_free(tr_attention_match *m);
/* whether a bool mask (true: attend) given to the attention op is the
   causal one for tq queries and tk keys, recorded as a comparison of
   aranges (triu, tril, j <= i; see attention.c) or, once computed, by its
   values; the op then takes the causal flag instead, skipping the blocks
   it masks */
bool tr_attention_mask_is_causal(const vm_tensor *mask, int64_t tq, int64_t tk);

#endif
