// RUN: hir-opt %s -p fusion-to-hir | filecheck %s
// RUN: hir-opt %s -p fusion-to-hir > %t && hir-opt %t -p fusion-to-hir | diff %t -

// Maximal runs of pointwise ops become segments: a private function of fusion ops,
// called by one hir.launch_kernel that writes the values used after the run. A run
// of broadcasts only moves data, and is posted on the stream instead. Segments come
// before their host program, numbered in program order.

!m = !fusion.tensor<[?, 8], f32>
!s = !fusion.tensor<[], f32>

// One run, with its constant inside.

func.func @one_run(%x: !m) -> !m {
  %t = fusion.tanh %x : !m -> !m
  %c = fusion.constant 5.000000e-01 : f32 : !s
  %h = fusion.mul %t, %c : (!m, !s) -> !m
  %y = fusion.add %h, %x : (!m, !m) -> !m
  func.return %y : !m
}

// CHECK-LABEL: func.func private @one_run_segment_0(
// CHECK-SAME:      %x: !fusion.tensor<[?, 8], f32>) -> !fusion.tensor<[?, 8], f32> {
// CHECK-NEXT:    %t = fusion.tanh %x
// CHECK-NEXT:    %c = fusion.constant 5.000000e-01 : f32
// CHECK-NEXT:    %h = fusion.mul %t, %c
// CHECK-NEXT:    %y = fusion.add %h, %x
// CHECK-NEXT:    func.return %y
// CHECK-NEXT:  }
// CHECK-LABEL: func.func @one_run(
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[N]]) : !fusion.tensor<[?, 8], f32>
// CHECK-NEXT:    hir.launch_kernel @one_run_segment_0 ins(%x : !fusion.tensor<[?, 8], f32>) outs(%[[Y]] : !fusion.tensor<[?, 8], f32>)
// CHECK-NEXT:    func.return %[[Y]]

// Two runs split by a matmul; the constant that both read is computed in each, and
// the first run's exp is returned as well as used by the matmul.

!w = !fusion.tensor<[8, 8], f32>

func.func @two_runs(%x: !m, %w: !w) -> (!m, !m) {
  %c = fusion.constant 2.000000e+00 : f32 : !s
  %a = fusion.mul %x, %c : (!m, !s) -> !m
  %e = fusion.exp %a : !m -> !m
  %p = fusion.matmul %e, %w : (!m, !w) -> !m
  %y = fusion.sub %p, %c : (!m, !s) -> !m
  func.return %y, %e : !m, !m
}

// CHECK-LABEL: func.func private @two_runs_segment_0(
// CHECK-SAME:      %x: !fusion.tensor<[?, 8], f32>) -> !fusion.tensor<[?, 8], f32> {
// CHECK-NEXT:    %c = fusion.constant 2.000000e+00 : f32
// CHECK-NEXT:    %a = fusion.mul %x, %c
// CHECK-NEXT:    %e = fusion.exp %a
// CHECK-NEXT:    func.return %e
// CHECK-NEXT:  }
// CHECK-LABEL: func.func private @two_runs_segment_1(
// CHECK-SAME:      %p: !fusion.tensor<[?, 8], f32>) -> !fusion.tensor<[?, 8], f32> {
// CHECK-NEXT:    %c = fusion.constant 2.000000e+00 : f32
// CHECK-NEXT:    %y = fusion.sub %p, %c
// CHECK-NEXT:    func.return %y
// CHECK-NEXT:  }
// CHECK-LABEL: func.func @two_runs(
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[E:[^ ]+]] = hir.allocate(%[[N]])
// CHECK-NEXT:    hir.launch_kernel @two_runs_segment_0 ins(%x : {{.*}}) outs(%[[E]] : {{.*}})
// CHECK-NEXT:    %[[P:[^ ]+]] = hir.allocate(%[[N]])
// CHECK-NEXT:    hir.matmul ins(%[[E]], %w : {{.*}}) outs(%[[P]] : {{.*}})
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[N]])
// CHECK-NEXT:    hir.launch_kernel @two_runs_segment_1 ins(%[[P]] : {{.*}}) outs(%[[Y]] : {{.*}})
// CHECK-NEXT:    func.return %[[Y]], %[[E]]

// A segment returns each of its values used after it, in order; an unused op goes.

func.func @two_outputs(%x: !m) -> (!fusion.tensor<[?], f32>, !m) {
  %a = fusion.exp %x : !m -> !m
  %unused = fusion.log %a : !m -> !m
  %b = fusion.neg %a : !m -> !m
  %r = fusion.sum %a [1] : !m -> !fusion.tensor<[?], f32>
  func.return %r, %b : !fusion.tensor<[?], f32>, !m
}

// CHECK-LABEL: func.func private @two_outputs_segment_0(
// CHECK-SAME:      -> (!fusion.tensor<[?, 8], f32>, !fusion.tensor<[?, 8], f32>) {
// CHECK-NEXT:    %a = fusion.exp %x
// CHECK-NEXT:    %b = fusion.neg %a
// CHECK-NEXT:    func.return %a, %b
// CHECK-LABEL: func.func @two_outputs(
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[A:[^ ]+]] = hir.allocate(%[[N]])
// CHECK-NEXT:    %[[B:[^ ]+]] = hir.allocate(%[[N]])
// CHECK-NEXT:    hir.launch_kernel @two_outputs_segment_0 ins(%x : {{.*}}) outs(%[[A]], %[[B]] : {{.*}})
// CHECK-NEXT:    %[[R:[^ ]+]] = hir.allocate(%[[N]])
// CHECK-NEXT:    hir.reduction "sum" [1] ins(%[[A]] : {{.*}}) outs(%[[R]] : {{.*}})
// CHECK-NEXT:    func.return %[[R]], %[[B]]

// A run of broadcasts only is posted on the stream.

func.func @broadcasts(%v: !fusion.tensor<[?], f32>, %w: !w) -> !fusion.tensor<[1, ?, 1], f32> {
  %b = fusion.broadcast %v [0, 2] : !fusion.tensor<[?], f32> -> !fusion.tensor<[1, ?, 1], f32>
  func.return %b : !fusion.tensor<[1, ?, 1], f32>
}

// CHECK-LABEL: func.func private @broadcasts_segment_0(
// CHECK-NEXT:    %b = fusion.broadcast %v [0, 2]
// CHECK-NEXT:    func.return %b
// CHECK-LABEL: func.func @broadcasts(
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %v, 0
// CHECK-NEXT:    %[[B:[^ ]+]] = hir.allocate(%[[N]]) : !fusion.tensor<[1, ?, 1], f32>
// CHECK-NEXT:    hir.post_on_stream @broadcasts_segment_0 ins(%v : {{.*}}) outs(%[[B]] : {{.*}})
// CHECK-NEXT:    func.return %[[B]]

// A kernel walks one iteration space: a run is cut before an op whose result does not
// broadcast with those before it (here a weight's broadcast next to an activation).

!a = !fusion.tensor<[16, 12], f32>
!v = !fusion.tensor<[12, 8], f32>

func.func @two_spaces(%x: !a, %w: !v) -> (!fusion.tensor<[1, 12, 8], f32>, !a) {
  %b = fusion.broadcast %w [0] : !v -> !fusion.tensor<[1, 12, 8], f32>
  %s = fusion.sigmoid %x : !a -> !a
  %y = fusion.mul %x, %s : (!a, !a) -> !a
  func.return %b, %y : !fusion.tensor<[1, 12, 8], f32>, !a
}

// CHECK-LABEL: func.func private @two_spaces_segment_0(
// CHECK-SAME:      %w: !fusion.tensor<[12, 8], f32>) -> !fusion.tensor<[1, 12, 8], f32> {
// CHECK-NEXT:    %b = fusion.broadcast %w [0]
// CHECK-NEXT:    func.return %b
// CHECK-LABEL: func.func private @two_spaces_segment_1(
// CHECK-SAME:      %x: !fusion.tensor<[16, 12], f32>) -> !fusion.tensor<[16, 12], f32> {
// CHECK-NEXT:    %s = fusion.sigmoid %x
// CHECK-NEXT:    %y = fusion.mul %x, %s
// CHECK-NEXT:    func.return %y
// CHECK-LABEL: func.func @two_spaces(
// CHECK:         hir.post_on_stream @two_spaces_segment_0
// CHECK:         hir.launch_kernel @two_spaces_segment_1

// A value used after the run that is smaller than the run's space ends the run before
// it: a kernel writes each output at every point of its space. The row's broadcast
// gets a segment of its own, and the product starts the next run.

!r = !fusion.tensor<[12], f32>

func.func @smaller_output(%x: !a, %row: !r, %w: !fusion.tensor<[12, 4], f32>) -> (!a, !fusion.tensor<[1, 4], f32>) {
  %b = fusion.broadcast %row [0] : !r -> !fusion.tensor<[1, 12], f32>
  %y = fusion.mul %x, %b : (!a, !fusion.tensor<[1, 12], f32>) -> !a
  %z = fusion.matmul %b, %w : (!fusion.tensor<[1, 12], f32>, !fusion.tensor<[12, 4], f32>) -> !fusion.tensor<[1, 4], f32>
  func.return %y, %z : !a, !fusion.tensor<[1, 4], f32>
}

// CHECK-LABEL: func.func private @smaller_output_segment_0(
// CHECK-SAME:      %row: !fusion.tensor<[12], f32>) -> !fusion.tensor<[1, 12], f32> {
// CHECK-NEXT:    %b = fusion.broadcast %row [0]
// CHECK-NEXT:    func.return %b
// CHECK-LABEL: func.func private @smaller_output_segment_1(
// CHECK-SAME:      -> !fusion.tensor<[16, 12], f32> {
// CHECK-NEXT:    %y = fusion.mul %x, %b
// CHECK-NEXT:    func.return %y
// CHECK-LABEL: func.func @smaller_output(
// CHECK:         hir.post_on_stream @smaller_output_segment_0
// CHECK:         hir.launch_kernel @smaller_output_segment_1
// CHECK:         hir.matmul

// A constant before the cut stays where it is: the run still takes the op after it.

func.func @constant_before_the_cut(%x: !a, %row: !r, %w: !fusion.tensor<[12, 4], f32>) -> (!a, !fusion.tensor<[1, 4], f32>) {
  %c = fusion.constant 2.000000e+00 : f32 : !fusion.tensor<[], f32>
  %b = fusion.broadcast %row [0] : !r -> !fusion.tensor<[1, 12], f32>
  %y = fusion.mul %x, %b : (!a, !fusion.tensor<[1, 12], f32>) -> !a
  %z = fusion.mul %y, %c : (!a, !fusion.tensor<[], f32>) -> !a
  %m = fusion.matmul %b, %w : (!fusion.tensor<[1, 12], f32>, !fusion.tensor<[12, 4], f32>) -> !fusion.tensor<[1, 4], f32>
  func.return %z, %m : !a, !fusion.tensor<[1, 4], f32>
}

// CHECK-LABEL: func.func private @constant_before_the_cut_segment_0(
// CHECK-SAME:      %row: !fusion.tensor<[12], f32>) -> !fusion.tensor<[1, 12], f32> {
// CHECK-NEXT:    %b = fusion.broadcast %row [0]
// CHECK-NEXT:    func.return %b
// CHECK-LABEL: func.func private @constant_before_the_cut_segment_1(
// CHECK-SAME:      -> !fusion.tensor<[16, 12], f32> {
// CHECK-NEXT:    %c = fusion.constant 2.000000e+00
// CHECK-NEXT:    %y = fusion.mul %x, %b
// CHECK-NEXT:    %z = fusion.mul %y, %c
// CHECK-NEXT:    func.return %z
// CHECK-LABEL: func.func @constant_before_the_cut(
// CHECK-NOT:     = fusion.
// CHECK:         hir.post_on_stream @constant_before_the_cut_segment_0
// CHECK:         hir.launch_kernel @constant_before_the_cut_segment_1
// CHECK:         hir.matmul
// CHECK:         func.return

// A run passes over the ops it cannot hold, and over those that read them, up to the next
// communication: they stay after the segment. SwiGLU's backward as the partitioner orders
// it: the gradient times each half, the GEMM of a weight's gradient reading one product,
// then the sigmoid's backward on the other. One kernel computes both halves; the GEMM and
// the add that reads it follow it. (Of static extents: where they are dynamic, unrelated
// ops whose extents meet end a run, `_first_unrelated_dynamic`.)

!h = !fusion.tensor<[4, 8], f32>

func.func @past_a_matmul(%g: !h, %a: !h, %b: !h, %w: !w) -> (!h, !h) {
  %gb = fusion.mul %g, %b : (!h, !h) -> !h
  %ga = fusion.mul %g, %a : (!h, !h) -> !h
  %p = fusion.matmul %ga, %w : (!h, !w) -> !h
  %z = fusion.add %p, %g : (!h, !h) -> !h
  %s = fusion.sigmoid %a : !h -> !h
  %y = fusion.mul %gb, %s : (!h, !h) -> !h
  func.return %z, %y : !h, !h
}

// CHECK-LABEL: func.func private @past_a_matmul_segment_0(
// CHECK-SAME:      %g: !fusion.tensor<[4, 8], f32>, %b: !fusion.tensor<[4, 8], f32>, %a: !fusion.tensor<[4, 8], f32>)
// CHECK-SAME:      -> (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) {
// CHECK-NEXT:    %gb = fusion.mul %g, %b
// CHECK-NEXT:    %ga = fusion.mul %g, %a
// CHECK-NEXT:    %s = fusion.sigmoid %a
// CHECK-NEXT:    %y = fusion.mul %gb, %s
// CHECK-NEXT:    func.return %ga, %y
// CHECK-NEXT:  }
// CHECK-LABEL: func.func private @past_a_matmul_segment_1(
// CHECK-SAME:      %p: !fusion.tensor<[4, 8], f32>, %g: !fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[4, 8], f32> {
// CHECK-NEXT:    %z = fusion.add %p, %g
// CHECK-NEXT:    func.return %z
// CHECK-NEXT:  }
// CHECK-LABEL: func.func @past_a_matmul(
// CHECK:         hir.launch_kernel @past_a_matmul_segment_0 ins(%g, %b, %a : {{.*}}) outs(%[[GA:[^ ,]+]], %[[Y:[^ ]+]] : {{.*}})
// CHECK:         hir.matmul ins(%[[GA]], %w : {{.*}}) outs(%[[P:[^ ]+]] : {{.*}})
// CHECK:         hir.launch_kernel @past_a_matmul_segment_1 ins(%[[P]], %g : {{.*}}) outs(%[[Z:[^ ]+]] : {{.*}})
// CHECK:         func.return %[[Z]], %[[Y]]

// A run takes an op that reads one it passed over, and goes after that op: the silu that
// the min-cut partitioner recomputes at the start of a backward, then the view of the
// incoming gradient, then their product, are one kernel after the view. Not an add that
// reads a GEMM it passed over: it stays a kernel of its own after the GEMM (a sum of two
// products is the later GEMM's to make in its epilogue, `sum-in-matmul`).

!g3 = !fusion.tensor<[1, 4, 8], f32>

func.func @after_what_it_reads(%a: !h, %up: !g3, %w: !w) -> (!h, !h, !h) {
  %s = fusion.sigmoid %a : !h -> !h
  %silu = fusion.mul %a, %s : (!h, !h) -> !h
  %g = fusion.aten "aten.reshape.default"(%up, [4, 8]) : (!g3) -> !h
  %y = fusion.mul %g, %silu : (!h, !h) -> !h
  %q = fusion.matmul %a, %w : (!h, !w) -> !h
  %z = fusion.add %q, %a : (!h, !h) -> !h
  %p = fusion.matmul %y, %w : (!h, !w) -> !h
  func.return %y, %z, %p : !h, !h, !h
}

// CHECK-LABEL: func.func private @after_what_it_reads_segment_0(
// CHECK-SAME:      %a: !fusion.tensor<[4, 8], f32>, %g: !fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[4, 8], f32> {
// CHECK-NEXT:    %s = fusion.sigmoid %a
// CHECK-NEXT:    %silu = fusion.mul %a, %s
// CHECK-NEXT:    %y = fusion.mul %g, %silu
// CHECK-NEXT:    func.return %y
// CHECK-NEXT:  }
// CHECK-LABEL: func.func private @after_what_it_reads_segment_1(
// CHECK-NEXT:    %z = fusion.add %q, %a
// CHECK-LABEL: func.func @after_what_it_reads(
// CHECK:         hir.aten "aten.reshape.default"(%up, [4, 8]) ins(%up : {{.*}}) outs(%[[G:[^ ]+]] : {{.*}})
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate() : !fusion.tensor<[4, 8], f32>
// CHECK-NEXT:    hir.launch_kernel @after_what_it_reads_segment_0 ins(%a, %[[G]] : {{.*}}) outs(%[[Y]] : {{.*}})
// CHECK:         hir.matmul ins(%a, %w : {{.*}}) outs(%[[Q:[^ ]+]] : {{.*}})
// CHECK:         hir.launch_kernel @after_what_it_reads_segment_1 ins(%[[Q]], %a : {{.*}})
// CHECK:         hir.matmul ins(%[[Y]], %w : {{.*}})

// Any other op that reads a GEMM it passed over joins the run, which then goes after the
// GEMM: SwiGLU's forward on one device, silu of the gate projection times the up
// projection that the program computes after the silu, is one kernel.

func.func @swiglu_past_a_matmul(%x: !h, %w1: !w, %w3: !w) -> !h {
  %a = fusion.matmul %x, %w1 : (!h, !w) -> !h
  %s = fusion.sigmoid %a : !h -> !h
  %silu = fusion.mul %a, %s : (!h, !h) -> !h
  %b = fusion.matmul %x, %w3 : (!h, !w) -> !h
  %y = fusion.mul %silu, %b : (!h, !h) -> !h
  func.return %y : !h
}

// CHECK-LABEL: func.func private @swiglu_past_a_matmul_segment_0(
// CHECK-SAME:      %a: !fusion.tensor<[4, 8], f32>, %b: !fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[4, 8], f32> {
// CHECK-NEXT:    %s = fusion.sigmoid %a
// CHECK-NEXT:    %silu = fusion.mul %a, %s
// CHECK-NEXT:    %y = fusion.mul %silu, %b
// CHECK-NEXT:    func.return %y
// CHECK-NEXT:  }
// CHECK-LABEL: func.func @swiglu_past_a_matmul(
// CHECK:         hir.matmul ins(%x, %w1 : {{.*}}) outs(%[[A:[^ ]+]] : {{.*}})
// CHECK:         hir.matmul ins(%x, %w3 : {{.*}}) outs(%[[B:[^ ]+]] : {{.*}})
// CHECK:         hir.launch_kernel @swiglu_past_a_matmul_segment_0 ins(%[[A]], %[[B]] : {{.*}})
// CHECK-NOT:     hir.launch_kernel

// A run leaves to a later kernel the work it passes over a GEMM to take and would only
// write out for that kernel to read back: ops that nothing else of the run reads, that only
// pointwise ops read, and that read no more bytes than they write. A norm's backward on
// the layer's input recomputes the normalized input in f32 from the saved bf16 one; the
// kernel of the gradients before the GEMM would write it out in f32, the norm's kernel
// reads the bf16 value instead. A cast that narrows stays: the later kernel reads what it
// writes at half the bytes.

!hb = !fusion.tensor<[4, 8], bf16>
!rows = !fusion.tensor<[4, 1], f32>
!wb = !fusion.tensor<[8, 8], bf16>

func.func @left_for_its_reader(%g: !hb, %d: !hb, %saved: !hb, %rs: !rows, %u: !h, %w: !wb) -> (!hb, !hb) {
  %a = fusion.add %g, %d : (!hb, !hb) -> !hb
  %p = fusion.matmul %a, %w : (!hb, !wb) -> !hb
  %x = fusion.cast %saved : !hb -> !h
  %n = fusion.mul %x, %rs : (!h, !rows) -> !h
  %k = fusion.cast %u : !h -> !hb
  %q = fusion.cast %p : !hb -> !h
  %m = fusion.mul %q, %n : (!h, !h) -> !h
  %y = fusion.cast %m : !h -> !hb
  %z = fusion.add %y, %k : (!hb, !hb) -> !hb
  func.return %a, %z : !hb, !hb
}

// CHECK-LABEL: func.func private @left_for_its_reader_segment_0(
// CHECK-SAME:      %g: !fusion.tensor<[4, 8], bf16>, %d: !fusion.tensor<[4, 8], bf16>, %u: !fusion.tensor<[4, 8], f32>)
// CHECK-NEXT:    %a = fusion.add %g, %d
// CHECK-NEXT:    %k = fusion.cast %u
// CHECK-NEXT:    func.return %a, %k
// CHECK-LABEL: func.func private @left_for_its_reader_segment_1(
// CHECK-SAME:      %saved: !fusion.tensor<[4, 8], bf16>, %rs: !fusion.tensor<[4, 1], f32>, %p: !fusion.tensor<[4, 8], bf16>, %k: !fusion.tensor<[4, 8], bf16>)
// CHECK-NEXT:    %x = fusion.cast %saved
// CHECK-NEXT:    %n = fusion.mul %x, %rs
// CHECK-NEXT:    %q = fusion.cast %p
// CHECK-NEXT:    %m = fusion.mul %q, %n
// CHECK-NEXT:    %y = fusion.cast %m
// CHECK-NEXT:    %z = fusion.add %y, %k
// CHECK-NEXT:    func.return %z
// CHECK-LABEL: func.func @left_for_its_reader(
// CHECK:         hir.launch_kernel @left_for_its_reader_segment_0
// CHECK:         hir.matmul
// CHECK:         hir.launch_kernel @left_for_its_reader_segment_1
// CHECK-NOT:     hir.launch_kernel

// A communication ends a run: the pointwise op after the allgather stays after it, in a
// segment of its own, though it reads nothing the allgather makes. Once a run has passed
// over an op, it takes no op of a stream axis, which belongs in the stream loop of its
// neighbours.

!sharded = !fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [didx, _]>
!whole = !fusion.tensor<[2, 8], f32, mesh = [0, 1]>
!chunks = !fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [stream, _]>
!square = !fusion.tensor<[8, 8], f32, mesh = [0, 1]>

func.func @not_past_a_communication(%x: !sharded, %u: !whole, %c: !chunks, %w: !square) -> (!whole, !whole, !whole, !chunks) {
  %e = fusion.exp %u : !whole -> !whole
  %p = fusion.matmul %e, %w : (!whole, !square) -> !whole
  %t = fusion.tanh %c : !chunks -> !chunks
  %g = fusion.set %x : !sharded -> !whole
  %n = fusion.neg %u : !whole -> !whole
  func.return %g, %n, %p, %t : !whole, !whole, !whole, !chunks
}

// CHECK-LABEL: func.func private @not_past_a_communication_segment_0(
// CHECK-NEXT:    %e = fusion.exp %u
// CHECK-NEXT:    func.return %e
// CHECK-LABEL: func.func private @not_past_a_communication_segment_1(
// CHECK-NEXT:    %t = fusion.tanh %c
// CHECK-NEXT:    func.return %t
// CHECK-LABEL: func.func private @not_past_a_communication_segment_2(
// CHECK-NEXT:    %n = fusion.neg %u
// CHECK-NEXT:    func.return %n
// CHECK-LABEL: func.func @not_past_a_communication(
// CHECK:         hir.launch_kernel @not_past_a_communication_segment_0
// CHECK:         hir.matmul
// CHECK:         hir.launch_kernel @not_past_a_communication_segment_1
// CHECK:         hir.allgather
// CHECK:         hir.launch_kernel @not_past_a_communication_segment_2
