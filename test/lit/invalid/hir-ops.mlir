// The verifiers of hir ops: buffers, views, collectives, compute and segment calls.
// RUN: hir-opt %s --split-input-file --verify-diagnostics

func.func @allocate_too_few_sizes(%n: index) {
  // expected-error@+1 {{type [?, 4, ?] has 2 dynamic extent(s) but 1 size operand(s) were given}}
  %b = hir.allocate(%n) : !fusion.tensor<[?, 4, ?], f32>
  func.return
}

// -----

func.func @allocate_too_many_sizes(%n: index) {
  // expected-error@+1 {{type [4] has 0 dynamic extent(s) but 1 size operand(s) were given}}
  %b = hir.allocate(%n) : !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @allocate_order_not_a_permutation() {
  // expected-error@+1 {{order [0, 0] must list each of the buffer's 2 axes once, from the outermost in memory}}
  %b = hir.allocate() order [0, 0] : !fusion.tensor<[2, 4], f32>
  func.return
}

// -----

func.func @symmetric_allocate_with_order() {
  // expected-error@+1 {{a symmetric buffer has no order: its peers read it as one block, axes in order}}
  %b = hir.allocate() symmetric order [1, 0] : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
  func.return
}

// -----

func.func @symmetric_allocate_in_loop(%n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  scf.for %i = %c0 to %n step %c1 {
    // expected-error@+1 {{a symmetric buffer is allocated once per program and reused by every run, so its allocation must sit in the function body, not in 'scf.for'}}
    %b = hir.allocate() symmetric : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
  }
  func.return
}

// -----

func.func @reduce_copy_engine(%x: !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, %y: !fusion.tensor<[], f32, mesh = [0]>) {
  // expected-error@+1 {{hir.reduce has no copy-engine form, so it cannot take backend cuda; the copy engines move the bytes of hir.allgather, hir.allreduce, hir.reduce_scatter and of send/recv}}
  %w = hir.reduce %x into %y team [0, 1] root 0 op sum backend cuda : !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, !fusion.tensor<[], f32, mesh = [0]>
  func.return
}

// -----

func.func @gather_copy_engine(%x: !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, %y: !fusion.tensor<[2, 4], f32, mesh = [0]>) {
  // expected-error@+1 {{hir.gather has no copy-engine form, so it cannot take backend cuda}}
  %w = hir.gather %x into %y team [0, 1] root 0 backend cuda : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[2, 4], f32, mesh = [0]>
  func.return
}

// -----

func.func @send_recv_copy_engine(%x: !fusion.tensor<[4], f32, mesh = [0]>, %y: !fusion.tensor<[4], f32, mesh = [1]>) {
  // expected-error@+1 {{hir.send_recv has no copy-engine form, so it cannot take backend cuda}}
  %w = hir.send_recv %x into %y team [0, 1] root 0 backend cuda : !fusion.tensor<[4], f32, mesh = [0]>, !fusion.tensor<[4], f32, mesh = [1]>
  func.return
}

// -----

func.func @dim_axis(%b: !fusion.tensor<[4, 2], f32>) {
  // expected-error@+1 {{axis 2 is out of range for a buffer of rank 2}}
  %n = hir.dim %b, 2 : !fusion.tensor<[4, 2], f32>
  func.return
}

// -----

func.func @alias_select_axis(%b: !fusion.tensor<[4, 2], f32>, %i: index) {
  // expected-error@+1 {{axis 2 is out of range for a buffer of rank 2}}
  %v = hir.alias_select %b[2 = %i] : !fusion.tensor<[4, 2], f32> -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @alias_select_type(%b: !fusion.tensor<[4, 2], f32>, %i: index) {
  // expected-error@+1 {{selecting along axis 0 of !fusion.tensor<[4, 2], f32> gives !fusion.tensor<[2], f32>, not !fusion.tensor<[4], f32>}}
  %v = hir.alias_select %b[0 = %i] : !fusion.tensor<[4, 2], f32> -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @alias_select_sharding(%b: !fusion.tensor<[4, 2], f32, mesh = [0, 1], axes = [_, didx]>, %i: index) {
  // expected-error@+1 {{gives !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, not !fusion.tensor<[2], f32, mesh = [0, 1]>}}
  %v = hir.alias_select %b[0 = %i] : !fusion.tensor<[4, 2], f32, mesh = [0, 1], axes = [_, didx]> -> !fusion.tensor<[2], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @root_missing(%x: !fusion.tensor<[4], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{hir.broadcast needs a root device}}
  %w = hir.broadcast %x into %x team [0, 1] backend nccl : !fusion.tensor<[4], f32, mesh = [0, 1]>, !fusion.tensor<[4], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @root_not_in_team(%x: !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, %y: !fusion.tensor<[2], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{root 2 is not in the team [0, 1]}}
  %w = hir.gather %x into %y team [0, 1] root 2 backend nccl : !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, !fusion.tensor<[2], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @root_unexpected(%x: !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, %y: !fusion.tensor<[2], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{hir.allgather takes no root}}
  %w = hir.allgather %x into %y team [0, 1] root 0 backend nccl : !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, !fusion.tensor<[2], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @reduce_op_missing(%x: !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, %y: !fusion.tensor<[], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{hir.reduce needs a reduction op}}
  %w = hir.reduce %x into %y team [0, 1] root 0 backend nccl : !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, !fusion.tensor<[], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @reduce_op_unexpected(%x: !fusion.tensor<[2], f32, mesh = [0, 1]>, %y: !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>) {
  // expected-error@+1 {{hir.scatter takes no reduction op}}
  %w = hir.scatter %x into %y team [0, 1] root 0 op sum backend nccl : !fusion.tensor<[2], f32, mesh = [0, 1]>, !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>
  func.return
}

// -----

func.func @reduce_op_unsupported(%x: !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, %y: !fusion.tensor<[], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{reduction op average is not supported; expected one of sum, product, max, min}}
  %w = hir.allreduce %x into %y team [0, 1] op average backend nccl : !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, !fusion.tensor<[], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @send_recv_team(%x: !fusion.tensor<[4], f32, mesh = [0, 1, 2]>) {
  // expected-error@+1 {{send_recv needs a team of a sender and a receiver, got [0, 1, 2]}}
  %w = hir.send_recv %x into %x team [0, 1, 2] root 0 backend nccl : !fusion.tensor<[4], f32, mesh = [0, 1, 2]>, !fusion.tensor<[4], f32, mesh = [0, 1, 2]>
  func.return
}

// -----

func.func @collective_team_mesh(%x: !fusion.tensor<[4], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{device mesh [1, 1] lists device(s) [1] more than once}}
  %w = hir.allgather %x into %x team [1, 1] backend nccl : !fusion.tensor<[4], f32, mesh = [0, 1]>, !fusion.tensor<[4], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @matmul_inputs(%a: !fusion.tensor<[4, 4], f32>) {
  // expected-error@+1 {{hir.matmul takes 2 or 3 inputs, got 1}}
  hir.matmul ins(%a : !fusion.tensor<[4, 4], f32>) outs(%a : !fusion.tensor<[4, 4], f32>)
  func.return
}

// -----

func.func @matmul_accumulate_bias(%a: !fusion.tensor<[4, 4], f32>, %bias: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{hir.matmul accumulate takes 2 inputs, no bias: the out it adds the product to stands for one}}
  hir.matmul accumulate ins(%a, %a, %bias : !fusion.tensor<[4, 4], f32>, !fusion.tensor<[4, 4], f32>, !fusion.tensor<[4], f32>) outs(%a : !fusion.tensor<[4, 4], f32>)
  func.return
}

// -----

func.func @linear_inputs(%a: !fusion.tensor<[4, 4], f32>) {
  // expected-error@+1 {{hir.linear takes 2 or 3 inputs, got 4}}
  hir.linear ins(%a, %a, %a, %a : !fusion.tensor<[4, 4], f32>, !fusion.tensor<[4, 4], f32>, !fusion.tensor<[4, 4], f32>, !fusion.tensor<[4, 4], f32>) outs(%a : !fusion.tensor<[4, 4], f32>)
  func.return
}

// -----

func.func @copy_outputs(%a: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{hir.copy takes 1 outputs, got 2}}
  hir.copy ins(%a : !fusion.tensor<[4], f32>) outs(%a, %a : !fusion.tensor<[4], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @copy_shape(%a: !fusion.tensor<[4], f32>, %b: !fusion.tensor<[2, 2], f32>) {
  // expected-error@+1 {{copy from a buffer of local shape [4] into one of [2, 2]}}
  hir.copy ins(%a : !fusion.tensor<[4], f32>) outs(%b : !fusion.tensor<[2, 2], f32>)
  func.return
}

// -----

func.func @forwarded_source_is_an_input(%a: !fusion.tensor<[4], f32>) {
  %b = hir.allocate() : !fusion.tensor<[4], f32>
  // expected-error@+1 {{forwards_source makes the out the source buffer itself, so the source must be a buffer of hir.allocate in the copy's block, not symmetric; it is not a buffer of hir.allocate}}
  hir.copy ins(%a : !fusion.tensor<[4], f32>) outs(%b : !fusion.tensor<[4], f32>) forwards_source
  func.return
}

// -----

func.func @forwarded_into_a_symmetric_buffer() {
  %a = hir.allocate() : !fusion.tensor<[4], f32>
  %b = hir.allocate() symmetric : !fusion.tensor<[4], f32>
  // expected-error@+1 {{so the out must be a buffer of hir.allocate in the copy's block, not symmetric; it is symmetric, its memory mapped by its peers}}
  hir.copy ins(%a : !fusion.tensor<[4], f32>) outs(%b : !fusion.tensor<[4], f32>) forwards_source
  func.return
}

// -----

func.func @forwarded_from_another_block(%n: index) {
  %a = hir.allocate() : !fusion.tensor<[4], f32>
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  scf.for %i = %c0 to %n step %c1 {
    %b = hir.allocate() : !fusion.tensor<[4], f32>
    // expected-error@+1 {{so the source must be a buffer of hir.allocate in the copy's block, not symmetric; it is allocated in another block}}
    hir.copy ins(%a : !fusion.tensor<[4], f32>) outs(%b : !fusion.tensor<[4], f32>) forwards_source
  }
  func.return
}

// -----

func.func @forwarded_into_another_shape(%n: index) {
  %a = hir.allocate(%n) : !fusion.tensor<[?], f32>
  %b = hir.allocate() : !fusion.tensor<[4], f32>
  // expected-error@+1 {{forwards_source makes the out the source buffer itself, so both must have one local shape and element type; the source has [?] f32, the out [4] f32}}
  hir.copy ins(%a : !fusion.tensor<[?], f32>) outs(%b : !fusion.tensor<[4], f32>) forwards_source
  func.return
}

// -----

func.func @adopted_out_of_range(%x: !fusion.tensor<[3, 5], f32>) {
  %t = hir.allocate() : !fusion.tensor<[5, 3], f32>
  // expected-error@+1 {{adopted names out #1, but hir.aten has 1 out(s)}}
  hir.aten "aten.t.default" call "[[{'operand': 0}], {}]" ins(%x : !fusion.tensor<[3, 5], f32>) outs(%t : !fusion.tensor<[5, 3], f32>) adopted [1]
  func.return
}

// -----

!rq = !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>
!rk = !fusion.tensor<[2, 4, 8, 16], bf16, mesh = [0, 1]>
!rl = !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
func.func @adopted_by_a_block(%q: !rq, %k: !rk, %b: index) {
  %out = hir.allocate() : !rq
  %lse = hir.allocate() : !rl
  // expected-error@+1 {{adopted outs become the kernel's results, but with block the op writes its rows into the outs it is given}}
  hir.attention causal head_tail block %b ins(%q, %k, %k : !rq, !rk, !rk) outs(%out, %lse : !rq, !rl) adopted [0]
  func.return
}

// -----

func.func @adopted_twice(%x: !fusion.tensor<[3, 5], f32>) {
  %t = hir.allocate() : !fusion.tensor<[5, 3], f32>
  // expected-error@+1 {{adopted names the outs that become the tensors hir.aten makes, each once and in increasing order; got [0, 0]}}
  hir.aten "aten.t.default" call "[[{'operand': 0}], {}]" ins(%x : !fusion.tensor<[3, 5], f32>) outs(%t : !fusion.tensor<[5, 3], f32>) adopted [0, 0]
  func.return
}

// -----

func.func @adopted_slice(%x: !fusion.tensor<[3, 5], f32>) {
  %c0 = arith.constant 0 : index
  %both = hir.allocate() : !fusion.tensor<[2, 5, 3], f32>
  %first = hir.alias_select %both[0 = %c0] : !fusion.tensor<[2, 5, 3], f32> -> !fusion.tensor<[5, 3], f32>
  // expected-error@+1 {{out #0 is adopted, so it must be a buffer of hir.allocate in the op's block, not symmetric, that the op's result replaces; it is not a buffer of hir.allocate}}
  hir.aten "aten.t.default" call "[[{'operand': 0}], {}]" ins(%x : !fusion.tensor<[3, 5], f32>) outs(%first : !fusion.tensor<[5, 3], f32>) adopted [0]
  func.return
}

// -----

func.func private @spread(%w: !fusion.tensor<[4], f32>) -> !fusion.tensor<[1, 4], f32> {
  %s = fusion.broadcast %w [0] : !fusion.tensor<[4], f32> -> !fusion.tensor<[1, 4], f32>
  func.return %s : !fusion.tensor<[1, 4], f32>
}

func.func @adopted_symmetric(%w: !fusion.tensor<[4], f32>) {
  %s = hir.allocate() symmetric : !fusion.tensor<[1, 4], f32>
  // expected-error@+1 {{out #0 is adopted, so it must be a buffer of hir.allocate in the op's block, not symmetric, that the op's result replaces; it is symmetric, its memory mapped by its peers}}
  hir.post_on_stream @spread ins(%w : !fusion.tensor<[4], f32>) outs(%s : !fusion.tensor<[1, 4], f32>) adopted [0]
  func.return
}

// -----

func.func @pointwise_inputs(%a: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{hir.pointwise takes 1 or 2 inputs, got 3}}
  hir.pointwise "add" ins(%a, %a, %a : !fusion.tensor<[4], f32>, !fusion.tensor<[4], f32>, !fusion.tensor<[4], f32>) outs(%a : !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @pointwise_kind(%a: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{unknown pointwise kind 'gelu'; expected one of neg, abs, exp, log, sqrt, rsqrt, relu, tanh, sigmoid, erf, add, sub, mul, div, maximum, minimum, pow, cast}}
  hir.pointwise "gelu" ins(%a : !fusion.tensor<[4], f32>) outs(%a : !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @reduction_kind(%a: !fusion.tensor<[4], f32>, %r: !fusion.tensor<[], f32>) {
  // expected-error@+1 {{unknown reduction 'mean'; expected sum or max}}
  hir.reduction "mean" [0] ins(%a : !fusion.tensor<[4], f32>) outs(%r : !fusion.tensor<[], f32>)
  func.return
}

// -----

func.func @reduction_axis(%a: !fusion.tensor<[4], f32>, %r: !fusion.tensor<[], f32>) {
  // expected-error@+1 {{reduction axis 1 is out of range for a tensor of rank 1}}
  hir.reduction "sum" [1] ins(%a : !fusion.tensor<[4], f32>) outs(%r : !fusion.tensor<[], f32>)
  func.return
}

// -----

func.func @reduction_output(%a: !fusion.tensor<[4, 2], f32>, %r: !fusion.tensor<[2], f32>) {
  // expected-error@+1 {{reducing [4, 2] over [1] gives [4], but the output is [2]}}
  hir.reduction "max" [1] ins(%a : !fusion.tensor<[4, 2], f32>) outs(%r : !fusion.tensor<[2], f32>)
  func.return
}

// -----

func.func @reduction_no_axes(%a: !fusion.tensor<[4, 2], f32>) {
  // expected-error@+1 {{a reduction needs at least one axis}}
  hir.reduction "sum" [] ins(%a : !fusion.tensor<[4, 2], f32>) outs(%a : !fusion.tensor<[4, 2], f32>)
  func.return
}

// -----

func.func @unknown_callee(%a: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{'@missing' is not a function in this module}}
  hir.launch_kernel @missing ins(%a : !fusion.tensor<[4], f32>) outs(%a : !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func private @segment(%x: !fusion.tensor<[4], f32>) -> !fusion.tensor<[4], f32> {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  func.return %y : !fusion.tensor<[4], f32>
}

func.func @callee_inputs(%a: !fusion.tensor<[4], bf16>) {
  // expected-error@+1 {{'@segment' takes inputs (!fusion.tensor<[4], f32>) but the ins are (!fusion.tensor<[4], bf16>)}}
  hir.post_on_stream @segment ins(%a : !fusion.tensor<[4], bf16>) outs(%a : !fusion.tensor<[4], bf16>)
  func.return
}

// -----

func.func private @segment(%x: !fusion.tensor<[4], f32>) -> !fusion.tensor<[4], f32> {
  func.return %x : !fusion.tensor<[4], f32>
}

func.func @callee_results(%a: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{'@segment' returns 1 result(s) but 2 outs are given}}
  hir.launch_kernel @segment ins(%a : !fusion.tensor<[4], f32>) outs(%a, %a : !fusion.tensor<[4], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @not_a_buffer(%i: index) {
  // expected-error@+1 {{index should be of base attribute fusion.tensor}}
  "hir.deallocate"(%i) : (index) -> ()
  func.return
}

// -----

func.func @aten_returns_count(%x: !fusion.tensor<[4, 8], f32>, %y: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{aten.max.dim: 'returns' names 1 of ATen's results, but the op has 2 outs}}
  hir.aten "aten.max.dim" call "[[{'operand': 0}, 1], {}]" returns [0] ins(%x : !fusion.tensor<[4, 8], f32>) outs(%y, %y : !fusion.tensor<[4], f32>, !fusion.tensor<[4], f32>)
  func.return
}
