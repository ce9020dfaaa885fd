// RUN: hir-opt %s -p forward-buffers | filecheck %s
// RUN: hir-opt %s -p forward-buffers > %t && hir-opt %t -p forward-buffers | diff %t -

// forward-buffers marks a copy `forwards_source` where its out may be its source buffer
// (the source dies at the copy, the copy fills its out first, both whole buffers of the
// copy's block that only this device uses, of one shape and extents), and marks
// `adopted` the outs of an ATen op or a data-movement segment that may be the tensors
// the op makes (whole buffers of its block that it fills first). It marks what it finds
// and only that: a mark the program no longer allows is removed.

!s = !fusion.tensor<[?, 4], f32, axes = [stream, _]>
!t = !fusion.tensor<[?, 4], f32>
!w = !fusion.tensor<[4, ?], f32>
!v = !fusion.tensor<[4], f32>
!m = !fusion.tensor<[?, 4], f32, mesh = [0, 1]>

// A pipelined loop's result copied for the readers after the loop, then freed.
// CHECK-LABEL: func.func @dies_at_the_copy(
// CHECK:         hir.copy ins(%s : {{.*}}) outs(%whole : {{[^)]*}}) forwards_source{{$}}
// CHECK-NEXT:    hir.deallocate %s
func.func @dies_at_the_copy(%x: !t) -> !t {
  %n = hir.dim %x, 0 : !t
  %s = hir.allocate(%n) : !s
  hir.pointwise "neg" ins(%x : !t) outs(%s : !s)
  %whole = hir.allocate(%n) : !t
  hir.copy ins(%s : !s) outs(%whole : !t)
  hir.deallocate %s : !s
  func.return %whole : !t
}

// Extents that are the same extent, read twice, compare equal.
// CHECK-LABEL: func.func @same_extent_read_twice(
// CHECK:         hir.copy {{.*}} forwards_source{{$}}
func.func @same_extent_read_twice(%x: !t) -> !t {
  %n = hir.dim %x, 0 : !t
  %also_n = hir.dim %x, 0 : !t
  %s = hir.allocate(%n) : !s
  hir.pointwise "neg" ins(%x : !t) outs(%s : !s)
  %whole = hir.allocate(%also_n) : !t
  hir.copy ins(%s : !s) outs(%whole : !t)
  hir.deallocate %s : !s
  func.return %whole : !t
}

// The source and the out are only read after the copy (a kernel fused after a pipelined
// loop reads the loop's result, the readers after the loop its copy): one buffer holds
// what both would. Read by an op that also writes it, or returned, it is not.
// CHECK-LABEL: func.func @only_read_after_the_copy(
// CHECK:         hir.copy ins(%s : {{.*}}) outs(%whole : {{[^)]*}}) forwards_source{{$}}
// CHECK:         hir.copy ins(%w : {{.*}}) outs(%w_copy : {{[^)]*}}){{$}}
func.func @only_read_after_the_copy(%x: !t) -> (!t, !t, !t) {
  %n = hir.dim %x, 0 : !t
  %s = hir.allocate(%n) : !s
  hir.pointwise "neg" ins(%x : !t) outs(%s : !s)
  %whole = hir.allocate(%n) : !t
  hir.copy ins(%s : !s) outs(%whole : !t)
  %y = hir.allocate(%n) : !t
  hir.pointwise "exp" ins(%s : !s) outs(%y : !t)
  hir.deallocate %s : !s
  %z = hir.allocate(%n) : !t
  hir.pointwise "abs" ins(%whole : !t) outs(%z : !t)
  %w = hir.allocate(%n) : !t
  hir.pointwise "neg" ins(%x : !t) outs(%w : !t)
  %w_copy = hir.allocate(%n) : !t
  hir.copy ins(%w : !t) outs(%w_copy : !t)
  hir.pointwise "exp" ins(%w : !t) outs(%w : !t)
  hir.deallocate %w : !t
  func.return %y, %z, %w_copy : !t, !t, !t
}

// The source is written after the copy (a stale mark is removed), or the function
// returns both the source and the out (the caller would get one buffer twice): the out
// must hold the value of the copy, so bytes move.
// CHECK-LABEL: func.func @source_lives_on(
// CHECK-NOT:     forwards_source
// CHECK:         func.return
func.func @source_lives_on(%x: !t) -> (!t, !t, !t, !t) {
  %n = hir.dim %x, 0 : !t
  %a = hir.allocate(%n) : !t
  hir.pointwise "exp" ins(%x : !t) outs(%a : !t)
  %a_copy = hir.allocate(%n) : !t
  hir.copy ins(%a : !t) outs(%a_copy : !t) forwards_source
  hir.pointwise "abs" ins(%x : !t) outs(%a : !t)
  %c = hir.allocate(%n) : !t
  hir.pointwise "neg" ins(%x : !t) outs(%c : !t)
  %c_copy = hir.allocate(%n) : !t
  hir.copy ins(%c : !t) outs(%c_copy : !t)
  func.return %a, %a_copy, %c, %c_copy : !t, !t, !t, !t
}

// Returned counts as read: the caller reads what the program returns after the
// program's own reads. A source read through a view after the copy, whose out is
// returned, and a source returned (a pipelined loop's result that the backward reads),
// whose out a kernel reads before it is freed: one buffer holds what both would.
// CHECK-LABEL: func.func @returned_after_the_reads(
// CHECK:         hir.copy ins(%b : {{.*}}) outs(%b_copy : {{[^)]*}}) forwards_source{{$}}
// CHECK:         hir.copy ins(%row : {{.*}}) outs(%row_copy : {{[^)]*}}){{$}}
// CHECK:         hir.copy ins(%s : {{.*}}) outs(%whole : {{[^)]*}}) forwards_source{{$}}
func.func @returned_after_the_reads(%x: !t) -> (!t, !v, !s, !t) {
  %n = hir.dim %x, 0 : !t
  %c0 = arith.constant 0 : index
  %b = hir.allocate(%n) : !t
  hir.pointwise "neg" ins(%x : !t) outs(%b : !t)
  %b_copy = hir.allocate(%n) : !t
  hir.copy ins(%b : !t) outs(%b_copy : !t)
  %row = hir.alias_select %b[0 = %c0] : !t -> !v
  %row_copy = hir.allocate() : !v
  hir.copy ins(%row : !v) outs(%row_copy : !v)
  hir.deallocate %b : !t
  %s = hir.allocate(%n) : !s
  hir.pointwise "neg" ins(%x : !t) outs(%s : !s)
  %whole = hir.allocate(%n) : !t
  hir.copy ins(%s : !s) outs(%whole : !t)
  %y = hir.allocate(%n) : !t
  hir.pointwise "exp" ins(%whole : !t) outs(%y : !t)
  hir.deallocate %whole : !t
  func.return %b_copy, %row_copy, %s, %y : !t, !v, !s, !t
}

// A communication reads its buffer until its wait: a source still being sent lives on.
// CHECK-LABEL: func.func @sent_until_the_wait(
// CHECK-NOT:     forwards_source
// CHECK:         func.return
func.func @sent_until_the_wait(%x: !m, %peer: index) -> !m {
  %n = hir.dim %x, 0 : !m
  %a = hir.allocate(%n) : !m
  hir.pointwise "neg" ins(%x : !m) outs(%a : !m)
  hir.start_coalescing
  %sent = hir.send %a to %peer backend nccl : !m
  %batch = hir.end_coalescing
  %whole = hir.allocate(%n) : !m
  hir.copy ins(%a : !m) outs(%whole : !m)
  hir.wait %batch
  hir.deallocate %a : !m
  func.return %whole : !m
}

// The out is read before the copy (a view made first would not see the source), the
// source is symmetric (its peers map its memory), or the extents differ.
// CHECK-LABEL: func.func @out_or_source_unfit(
// CHECK-NOT:     forwards_source
// CHECK:         func.return
func.func @out_or_source_unfit(%x: !t, %y: !t) -> (!t, !v, !t, !t) {
  %n = hir.dim %x, 0 : !t
  %m = hir.dim %y, 0 : !t
  %c0 = arith.constant 0 : index
  %a = hir.allocate(%n) : !t
  hir.pointwise "neg" ins(%x : !t) outs(%a : !t)
  %out = hir.allocate(%n) : !t
  %first_row = hir.alias_select %out[0 = %c0] : !t -> !v
  hir.copy ins(%a : !t) outs(%out : !t)
  hir.deallocate %a : !t
  %sym = hir.allocate(%n) symmetric : !t
  hir.pointwise "neg" ins(%x : !t) outs(%sym : !t)
  %from_sym = hir.allocate(%n) : !t
  hir.copy ins(%sym : !t) outs(%from_sym : !t)
  %b = hir.allocate(%n) : !t
  hir.pointwise "neg" ins(%x : !t) outs(%b : !t)
  %other_extent = hir.allocate(%m) : !t
  hir.copy ins(%b : !t) outs(%other_extent : !t)
  hir.deallocate %b : !t
  func.return %out, %first_row, %from_sym, %other_extent : !t, !v, !t, !t
}

// ATen's results: a whole buffer the op fills first becomes the result; a slice of a
// larger buffer, and a buffer viewed before the op (a stale mark is removed), get it
// copied in.
// CHECK-LABEL: func.func @aten_results(
// CHECK:         hir.aten "aten.t.default"{{.*}} outs(%t : {{[^)]*}}) adopted [0]{{$}}
// CHECK:         hir.aten "aten.var_mean.correction"{{.*}} outs(%var_slot, %mean : {{[^)]*}}) adopted [1]{{$}}
// CHECK:         hir.aten "aten.t.default"{{.*}} outs(%viewed : {{[^)]*}}){{$}}
func.func @aten_results(%x: !t) -> (!w, !fusion.tensor<[2, ?], f32>, !fusion.tensor<[?], f32>, !w, !fusion.tensor<[4], f32>) {
  %n = hir.dim %x, 0 : !t
  %c0 = arith.constant 0 : index
  %t = hir.allocate(%n) : !w
  hir.aten "aten.t.default" call "[[{'operand': 0}], {}]" ins(%x : !t) outs(%t : !w)
  %both = hir.allocate(%n) : !fusion.tensor<[2, ?], f32>
  %var_slot = hir.alias_select %both[0 = %c0] : !fusion.tensor<[2, ?], f32> -> !fusion.tensor<[?], f32>
  %mean = hir.allocate(%n) : !fusion.tensor<[?], f32>
  hir.aten "aten.var_mean.correction" call "[[{'operand': 0}, [1]], {}]" ins(%x : !t) outs(%var_slot, %mean : !fusion.tensor<[?], f32>, !fusion.tensor<[?], f32>)
  %viewed = hir.allocate(%n) : !w
  %column = hir.alias_select %viewed[1 = %c0] : !w -> !fusion.tensor<[4], f32>
  hir.aten "aten.t.default" call "[[{'operand': 0}], {}]" ins(%x : !t) outs(%viewed : !w) adopted [0]
  func.return %t, %both, %mean, %viewed, %column : !w, !fusion.tensor<[2, ?], f32>, !fusion.tensor<[?], f32>, !w, !fusion.tensor<[4], f32>
}

// ATen's result may be a view of its operands: it becomes the result where a later write
// changes nothing else. A GEMM that adds into rows selected from a buffer that is returned
// afterwards (an attention's output, which the backward reads) would change that buffer,
// and the rows are copied in; where the selected buffer dies at the select (a residual sum
// viewed as sequences), the view is its memory's only name, and the GEMM adds into it.
// A view of a view counts: the weight's transpose, reshaped and added into, is a copy.
// CHECK-LABEL: func.func @views_written_after(
// CHECK:         hir.aten "aten.select.int"{{.*}} outs(%rows : {{[^)]*}}){{$}}
// CHECK:         hir.aten "aten.select.int"{{.*}} outs(%dead_rows : {{[^)]*}}) adopted [0]{{$}}
// CHECK:         hir.aten "aten.t.default"{{.*}} outs(%tw : {{[^)]*}}){{$}}
// CHECK:         hir.aten "aten.reshape.default"{{.*}} outs(%rw : {{[^)]*}}) adopted [0]{{$}}
!b = !fusion.tensor<[2, 1, 4, 4], f32>
!r = !fusion.tensor<[2, 4, 4], f32>
!sq = !fusion.tensor<[4, 4], f32>
func.func @views_written_after(%x: !b, %a: !r, %w: !sq, %a2: !fusion.tensor<[2, 3], f32>, %b2: !fusion.tensor<[3, 8], f32>) -> (!r, !b, !r, !fusion.tensor<[2, 8], f32>, !sq) {
  %kept = hir.allocate() : !b
  hir.pointwise "neg" ins(%x : !b) outs(%kept : !b)
  %rows = hir.allocate() : !r
  hir.aten "aten.select.int" call "[[{'operand': 0}, 1, 0], {}]" ins(%kept : !b) outs(%rows : !r)
  hir.matmul accumulate ins(%a, %w : !r, !sq) outs(%rows : !r)
  %dead = hir.allocate() : !b
  hir.pointwise "neg" ins(%x : !b) outs(%dead : !b)
  %dead_rows = hir.allocate() : !r
  hir.aten "aten.select.int" call "[[{'operand': 0}, 1, 0], {}]" ins(%dead : !b) outs(%dead_rows : !r)
  hir.deallocate %dead : !b
  hir.matmul accumulate ins(%a, %w : !r, !sq) outs(%dead_rows : !r)
  %tw = hir.allocate() : !sq
  hir.aten "aten.t.default" call "[[{'operand': 0}], {}]" ins(%w : !sq) outs(%tw : !sq)
  %rw = hir.allocate() : !fusion.tensor<[2, 8], f32>
  hir.aten "aten.reshape.default" call "[[{'operand': 0}, [2, 8]], {}]" ins(%tw : !sq) outs(%rw : !fusion.tensor<[2, 8], f32>)
  hir.deallocate %tw : !sq
  hir.matmul accumulate ins(%a2, %b2 : !fusion.tensor<[2, 3], f32>, !fusion.tensor<[3, 8], f32>) outs(%rw : !fusion.tensor<[2, 8], f32>)
  func.return %rows, %kept, %dead_rows, %rw, %w : !r, !b, !r, !fusion.tensor<[2, 8], f32>, !sq
}

func.func private @spread(%w: !v) -> !fusion.tensor<[1, 4], f32> {
  %s = fusion.broadcast %w [0] : !v -> !fusion.tensor<[1, 4], f32>
  func.return %s : !fusion.tensor<[1, 4], f32>
}

// A data-movement segment's result is a view of its input: the weight a matmul reads
// through a broadcast stays the weight.
// CHECK-LABEL: func.func @spread_weight(
// CHECK:         hir.post_on_stream @spread ins(%w : {{.*}}) outs(%s : {{[^)]*}}) adopted [0]{{$}}
func.func @spread_weight(%x: !fusion.tensor<[2, 5, 4], f32>, %w: !v) -> !fusion.tensor<[2, 5], f32> {
  %s = hir.allocate() : !fusion.tensor<[1, 4], f32>
  hir.post_on_stream @spread ins(%w : !v) outs(%s : !fusion.tensor<[1, 4], f32>)
  %y = hir.allocate() : !fusion.tensor<[2, 5], f32>
  hir.aten "aten.sum.dim_IntList" call "[[{'operand': 0}, [2]], {}]" ins(%x : !fusion.tensor<[2, 5, 4], f32>) outs(%y : !fusion.tensor<[2, 5], f32>)
  hir.deallocate %s : !fusion.tensor<[1, 4], f32>
  func.return %y : !fusion.tensor<[2, 5], f32>
}

// An attention kernel's results: whole buffers it fills first become them (the heads stay
// inside the rows, as the kernel lays them out); an out of another element type than the
// kernel makes (f32 for bf16 queries) gets its result copied in, and so do the outs of a
// ring's step (`block`), which writes its rows into the outs it is given.
// CHECK-LABEL: func.func @attention_results(
// CHECK:         hir.attention causal top_left ins({{.*}}) outs(%out, %lse : {{[^)]*}}) adopted [0, 1]{{$}}
// CHECK:         hir.attention_backward causal top_left ins({{.*}}) outs(%dq, %dk, %dv : {{[^)]*}}) adopted [0, 1]{{$}}
// CHECK:         hir.attention causal head_tail block %b ins({{.*}}) outs(%ring, %ring_lse : {{[^)]*}}){{$}}
!q = !fusion.tensor<[2, 4, 8, 16], bf16>
!l = !fusion.tensor<[2, 4, 8], f32>
!wide = !fusion.tensor<[2, 4, 8, 16], f32>
!rq = !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>
!rk = !fusion.tensor<[2, 4, 8, 16], bf16, mesh = [0, 1]>
!rl = !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
func.func @attention_results(%q: !q, %dout: !q, %rq: !rq, %rk: !rk, %b: index) -> (!q, !l, !q, !q, !wide, !rq, !rl) {
  %out = hir.allocate() : !q
  %lse = hir.allocate() : !l
  hir.attention causal top_left ins(%q, %q, %q : !q, !q, !q) outs(%out, %lse : !q, !l)
  %dq = hir.allocate() : !q
  %dk = hir.allocate() : !q
  %dv = hir.allocate() : !wide
  hir.attention_backward causal top_left ins(%dout, %q, %q, %q, %out, %lse : !q, !q, !q, !q, !q, !l) outs(%dq, %dk, %dv : !q, !q, !wide)
  %ring = hir.allocate() : !rq
  %ring_lse = hir.allocate() : !rl
  hir.attention causal head_tail block %b ins(%rq, %rk, %rk : !rq, !rk, !rk) outs(%ring, %ring_lse : !rq, !rl)
  func.return %out, %lse, %dq, %dk, %dv, %ring, %ring_lse : !q, !l, !q, !q, !wide, !rq, !rl
}
