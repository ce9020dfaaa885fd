// The verifiers of the attention ops of both dialects, and their syntax.
// RUN: hir-opt %s --split-input-file --verify-diagnostics

func.func @integer_attention(%q: !fusion.tensor<[4, 8], i64>) {
  // expected-error@+1 {{queries, keys and values must have one floating element type; they are i64, i64, i64}}
  %o, %l = fusion.attention %q, %q, %q : (!fusion.tensor<[4, 8], i64>, !fusion.tensor<[4, 8], i64>, !fusion.tensor<[4, 8], i64>) -> (!fusion.tensor<[4, 8], i64>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @widths(%q: !fusion.tensor<[4, 8], f32>, %k: !fusion.tensor<[6, 16], f32>) {
  // expected-error@+1 {{queries of width 8 against keys of width 16; they must be equal}}
  %o, %l = fusion.attention %q, %k, %k : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[6, 16], f32>, !fusion.tensor<[6, 16], f32>) -> (!fusion.tensor<[4, 16], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @keys_and_values(%q: !fusion.tensor<[4, 8], f32>, %k: !fusion.tensor<[6, 8], f32>, %v: !fusion.tensor<[5, 8], f32>) {
  // expected-error@+1 {{6 keys against 5 values; they must be as many}}
  %o, %l = fusion.attention %q, %k, %v : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[6, 8], f32>, !fusion.tensor<[5, 8], f32>) -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @mask_and_causal(%q: !fusion.tensor<[4, 8], f32>, %m: !fusion.tensor<[4, 4], i1>) {
  // expected-error@+1 {{an attention takes a mask operand or a causal mask, not both}}
  %o, %l = fusion.attention %q, %q, %q mask %m causal top_left : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 4], i1>) -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @mask_type(%q: !fusion.tensor<[4, 8], f32>, %m: !fusion.tensor<[4, 4], bf16>) {
  // expected-error@+1 {{the mask is bf16; it must be i1 (true: the key is seen) or f32, the queries' type (added to the scores)}}
  %o, %l = fusion.attention %q, %q, %q mask %m : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 4], bf16>) -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @mask_shape(%q: !fusion.tensor<[4, 8], f32>, %m: !fusion.tensor<[4, 5], i1>) {
  // expected-error@+1 {{the mask [4, 5] must end in the queries' and the keys' rows [4, 4]}}
  %o, %l = fusion.attention %q, %q, %q mask %m : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 5], i1>) -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @mask_of_blocks(%q: !fusion.tensor<[4, 8], f32>, %k: !fusion.tensor<[2, 2, 8], f32>, %m: !fusion.tensor<[4, 4], i1>) {
  // expected-error@+1 {{a mask operand covers the keys as one sequence, so the keys cannot be in blocks}}
  %o, %l = fusion.attention %q, %k, %k mask %m blocks : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[2, 2, 8], f32>, !fusion.tensor<[2, 2, 8], f32>, !fusion.tensor<[4, 4], i1>) -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @layout_of_replicated_queries(%q: !fusion.tensor<[4, 8], f32, mesh = [0, 1]>, %k: !fusion.tensor<[8, 8], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{causal head_tail masks by the positions of the queries' rows in a sequence sharded over their mesh, so the queries must vary over it (didx axis 0)}}
  %o, %l = fusion.attention %q, %k, %k causal head_tail : (!fusion.tensor<[4, 8], f32, mesh = [0, 1]>, !fusion.tensor<[8, 8], f32, mesh = [0, 1]>, !fusion.tensor<[8, 8], f32, mesh = [0, 1]>) -> (!fusion.tensor<[4, 8], f32, mesh = [0, 1]>, !fusion.tensor<[4], f32, mesh = [0, 1]>)
  func.return
}

// -----

func.func @layout_of_part_of_the_keys(%q: !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, %k: !fusion.tensor<[4, 8], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{causal contiguous: the keys must be the rows of every device of the queries' mesh, 2 x 4, but there are 4}}
  %o, %l = fusion.attention %q, %k, %k causal contiguous : (!fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[4, 8], f32, mesh = [0, 1]>, !fusion.tensor<[4, 8], f32, mesh = [0, 1]>) -> (!fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>)
  func.return
}

// -----

func.func @head_tail_of_odd_rows(%q: !fusion.tensor<[2, 3, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, %k: !fusion.tensor<[6, 8], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{causal head_tail: each device's 3 rows must be two chunks of one length}}
  %o, %l = fusion.attention %q, %k, %k causal head_tail : (!fusion.tensor<[2, 3, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[6, 8], f32, mesh = [0, 1]>, !fusion.tensor<[6, 8], f32, mesh = [0, 1]>) -> (!fusion.tensor<[2, 3, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>)
  func.return
}

// -----

func.func @blocks_of_two_axes(%q: !fusion.tensor<[4, 8], f32>, %k: !fusion.tensor<[4, 8], f32>) {
  // expected-error@+1 {{attention keys and values of shape [4, 8] need at least 3 axes (blocks, rows and their width)}}
  %o, %l = fusion.attention %q, %k, %k blocks : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @output_shape(%q: !fusion.tensor<[4, 8], f32>, %v: !fusion.tensor<[4, 16], f32>) {
  // expected-error@+1 {{the output has shape [4, 8], but the operands give [4, 16]}}
  %o, %l = fusion.attention %q, %q, %v : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 16], f32>) -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @lse_type(%q: !fusion.tensor<[4, 8], bf16>) {
  // expected-error@+1 {{the log-sum-exp is bf16, expected f32}}
  %o, %l = fusion.attention %q, %q, %q : (!fusion.tensor<[4, 8], bf16>, !fusion.tensor<[4, 8], bf16>, !fusion.tensor<[4, 8], bf16>) -> (!fusion.tensor<[4, 8], bf16>, !fusion.tensor<[4], bf16>)
  func.return
}

// -----

func.func @gradient_of_replicated_keys(%q: !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, %k: !fusion.tensor<[4, 8], f32, mesh = [0, 1]>, %l: !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>) {
  // expected-error@+1 {{the keys' gradient has shape [4, 8], but the operands give [2, 4, 8]}}
  %dq, %dk, %dv = fusion.attention_backward %q, %q, %k, %k, %q, %l : (!fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[4, 8], f32, mesh = [0, 1]>, !fusion.tensor<[4, 8], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>) -> (!fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[4, 8], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>)
  func.return
}

// -----

func.func @backward_lse(%q: !fusion.tensor<[4, 8], f32>, %l: !fusion.tensor<[4, 1], f32>) {
  // expected-error@+1 {{the log-sum-exp is [4, 1] f32; expected [4] f32}}
  %dq, %dk, %dv = fusion.attention_backward %q, %q, %q, %q, %q, %l : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 1], f32>) -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>)
  func.return
}

// -----

func.func @two_operands(%q: !fusion.tensor<[4, 8], f32>) {
  // expected-error@+1 {{fusion.attention takes 3 operands before its mask, got 2}}
  %o, %l = fusion.attention %q, %q : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @unknown_causal_mask(%q: !fusion.tensor<[4, 8], f32>) {
  // expected-error@+1 {{Expected `top_left`, `contiguous`, or `head_tail`.}}
  %o, %l = fusion.attention %q, %q, %q causal bottom_right : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @block_without_layout(%q: !fusion.tensor<[4, 8], f32>, %s: index) {
  %o = hir.allocate() : !fusion.tensor<[4, 8], f32>
  %l = hir.allocate() : !fusion.tensor<[4], f32>
  // expected-error@+1 {{block names the device whose rows the keys are, which places them in a sequence sharded over the queries' mesh: it needs causal contiguous or head_tail, and keys not in blocks}}
  hir.attention causal top_left block %s ins(%q, %q, %q : !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) outs(%o, %l : !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @block_of_the_whole_sequence(%q: !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, %k: !fusion.tensor<[8, 8], f32, mesh = [0, 1]>, %s: index) {
  %o = hir.allocate() : !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>
  %l = hir.allocate() : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
  // expected-error@+1 {{the keys of a block are the 4 rows of one device, but there are 8}}
  hir.attention causal contiguous block %s ins(%q, %k, %k : !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[8, 8], f32, mesh = [0, 1]>, !fusion.tensor<[8, 8], f32, mesh = [0, 1]>) outs(%o, %l : !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>)
  func.return
}

// -----

func.func @out_type(%q: !fusion.tensor<[4, 8], bf16>) {
  %o = hir.allocate() : !fusion.tensor<[4, 8], f16>
  %l = hir.allocate() : !fusion.tensor<[4], f32>
  // expected-error@+1 {{the output is f16; expected bf16 or f32}}
  hir.attention ins(%q, %q, %q : !fusion.tensor<[4, 8], bf16>, !fusion.tensor<[4, 8], bf16>, !fusion.tensor<[4, 8], bf16>) outs(%o, %l : !fusion.tensor<[4, 8], f16>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @attention_outs(%q: !fusion.tensor<[4, 8], f32>) {
  %o = hir.allocate() : !fusion.tensor<[4, 8], f32>
  // expected-error@+1 {{hir.attention takes 2 outputs, got 1}}
  hir.attention ins(%q, %q, %q : !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) outs(%o : !fusion.tensor<[4, 8], f32>)
  func.return
}
