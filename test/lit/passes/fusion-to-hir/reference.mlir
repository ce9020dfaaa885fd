// RUN: hir-opt %s --split-input-file -p insert-reshardings,fusion-to-hir | filecheck %s
// RUN: hir-opt %s --split-input-file -p insert-reshardings,fusion-to-hir > %t && hir-opt %t --split-input-file -p insert-reshardings,fusion-to-hir | diff %t -

// The fusions of nvFuser's reference host programs (../shared/reference), lowered to
// the part before stream parallelisation: allocations, communications and their
// waits, compute.

// pr3736, AG+GEMM with bias: the gathered input is allocated and allgathered, then
// the linear writes the output. N is the weight's extent or the bias's.

!in = !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>
!w = !fusion.tensor<[?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
!b = !fusion.tensor<[?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
!out = !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _, _]>

func.func @ag_linear(%in: !in, %w: !w, %b: !b) -> !out {
  %out = fusion.linear %in, %w, %b : (!in, !w, !b) -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @ag_linear(
// CHECK-NEXT:    %[[S:[^ ]+]] = hir.dim %in, 0
// CHECK-NEXT:    %[[M:[^ ]+]] = hir.dim %in, 2
// CHECK-NEXT:    %[[K:[^ ]+]] = hir.dim %in, 3
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %w, 0
// CHECK-NEXT:    %[[NB:[^ ]+]] = hir.dim %b, 0
// CHECK-NEXT:    %[[G:[^ ]+]] = hir.allocate(%[[S]], %[[M]], %[[K]]) : !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _, _]>
// CHECK-NEXT:    %[[AG:[^ ]+]] = hir.allgather %in into %[[G]] team [0, 1, 2, 3, 4, 5, 6, 7] backend nccl
// CHECK-NEXT:    hir.wait %[[AG]]
// CHECK-NEXT:    %[[NOUT:[^ ]+]] = arith.maxui %[[N]], %[[NB]] : index
// CHECK-NEXT:    %[[OUT:[^ ]+]] = hir.allocate(%[[S]], %[[M]], %[[NOUT]]) : !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _, _]>
// CHECK-NEXT:    hir.linear ins(%[[G]], %w, %b : {{.*}}) outs(%[[OUT]] : {{.*}})
// CHECK-NEXT:    func.return %[[OUT]]

// -----

// AG_matmul, at mesh size 3.

!a = !fusion.tensor<[?, 3, ?, ?], f32, mesh = [0, 1, 2], axes = [_, didx, _, _]>
!bm = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2]>
!c = !fusion.tensor<[?, 3, ?, ?], f32, mesh = [0, 1, 2], axes = [stream, _, _, _]>

func.func @ag_matmul(%a: !a, %b: !bm) -> !c {
  %c = fusion.matmul %a, %b : (!a, !bm) -> !c
  func.return %c : !c
}

// CHECK-LABEL: func.func @ag_matmul(
// CHECK-NEXT:    %[[S:[^ ]+]] = hir.dim %a, 0
// CHECK-NEXT:    %[[M:[^ ]+]] = hir.dim %a, 2
// CHECK-NEXT:    %[[K:[^ ]+]] = hir.dim %a, 3
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %b, 1
// CHECK-NEXT:    %[[G:[^ ]+]] = hir.allocate(%[[S]], %[[M]], %[[K]]) : !fusion.tensor<[?, 3, ?, ?], f32, mesh = [0, 1, 2], axes = [stream, _, _, _]>
// CHECK-NEXT:    %[[AG:[^ ]+]] = hir.allgather %a into %[[G]] team [0, 1, 2] backend nccl
// CHECK-NEXT:    hir.wait %[[AG]]
// CHECK-NEXT:    %[[C:[^ ]+]] = hir.allocate(%[[S]], %[[M]], %[[N]])
// CHECK-NEXT:    hir.matmul ins(%[[G]], %b : {{.*}}) outs(%[[C]] : {{.*}})
// CHECK-NEXT:    func.return %[[C]]

// -----

// matmul_AR: a local matmul over the sharded batch axis, then the allreduce of the sum
// over it.

!a = !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>
!b = !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
!p = !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _, _]>
!o = !fusion.tensor<[?, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _]>

func.func @matmul_ar(%a: !a, %b: !b) -> !o {
  %p = fusion.matmul %a, %b : (!a, !b) -> !p
  %o = fusion.sum %p [1] : !p -> !o
  func.return %o : !o
}

// CHECK-LABEL: func.func @matmul_ar(
// CHECK:         %[[P:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.matmul ins(%a, %b : {{.*}}) outs(%[[P]] : {{.*}})
// CHECK-NEXT:    %[[O:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[AR:[^ ]+]] = hir.allreduce %[[P]] into %[[O]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend nccl
// CHECK-NEXT:    hir.wait %[[AR]]
// CHECK-NEXT:    func.return %[[O]]

// -----

// matmul_RS_through_bcast: the broadcast of B only moves data, so its segment is
// posted on the stream (nvFuser's HostUnit); the sum over the sharded axis into a
// sharded result is a reduce-scatter.

!a = !fusion.tensor<[?, 8, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _, _]>
!b = !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
!bb = !fusion.tensor<[1, 8, 1, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _, _]>
!p = !fusion.tensor<[?, 8, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _, _, _]>
!o = !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _, _]>

func.func @matmul_rs_through_bcast(%a: !a, %b: !b) -> !o {
  %bb = fusion.broadcast %b [0, 2] : !b -> !bb
  %p = fusion.matmul %a, %bb : (!a, !bb) -> !p
  %o = fusion.sum %p [1] : !p -> !o
  func.return %o : !o
}

// CHECK-LABEL: func.func private @matmul_rs_through_bcast_segment_0(
// CHECK-SAME:      %b: !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>) -> !fusion.tensor<[1, 8, 1, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _, _]>
// CHECK-NEXT:    %bb = fusion.broadcast %b [0, 2]
// CHECK-NEXT:    func.return %bb
// CHECK-LABEL: func.func @matmul_rs_through_bcast(
// CHECK:         %[[BB:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.post_on_stream @matmul_rs_through_bcast_segment_0 ins(%b : {{.*}}) outs(%[[BB]] : {{.*}})
// CHECK-NEXT:    %[[P:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.matmul ins(%a, %[[BB]] : {{.*}}) outs(%[[P]] : {{.*}})
// CHECK-NEXT:    %[[O:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[RS:[^ ]+]] = hir.reduce_scatter %[[P]] into %[[O]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend nccl
// CHECK-NEXT:    hir.wait %[[RS]]
// CHECK-NEXT:    func.return %[[O]]

// -----

// Single-device fusions (pr4147): set, sum, matmul, linear, a binary op.

!m = !fusion.tensor<[?, ?], f32>
!ms = !fusion.tensor<[?, ?], f32, axes = [stream, _]>
!t = !fusion.tensor<[?, ?, ?], f32>
!v = !fusion.tensor<[?], f32>

func.func @single_set(%x: !m) -> !ms {
  %y = fusion.set %x : !m -> !ms
  func.return %y : !ms
}

// CHECK-LABEL: func.func @single_set(
// CHECK-NEXT:    %[[D0:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[D1:[^ ]+]] = hir.dim %x, 1
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[D0]], %[[D1]]) : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
// CHECK-NEXT:    hir.copy ins(%x : {{.*}}) outs(%[[Y]] : {{.*}})
// CHECK-NEXT:    func.return %[[Y]]

func.func @reduction(%x: !t) -> !ms {
  %y = fusion.sum %x [2] : !t -> !ms
  func.return %y : !ms
}

// CHECK-LABEL: func.func @reduction(
// CHECK-NEXT:    %[[D0:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[D1:[^ ]+]] = hir.dim %x, 1
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[D0]], %[[D1]])
// CHECK-NEXT:    hir.reduction "sum" [2] ins(%x : {{.*}}) outs(%[[Y]] : {{.*}})
// CHECK-NEXT:    func.return %[[Y]]

func.func @matmul(%x: !m, %w: !m) -> !ms {
  %y = fusion.matmul %x, %w : (!m, !m) -> !ms
  func.return %y : !ms
}

// CHECK-LABEL: func.func @matmul(
// CHECK-NEXT:    %[[M:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %w, 1
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[M]], %[[N]])
// CHECK-NEXT:    hir.matmul ins(%x, %w : {{.*}}) outs(%[[Y]] : {{.*}})
// CHECK-NEXT:    func.return %[[Y]]

func.func @linear(%x: !t, %w: !m, %b: !v) -> !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]> {
  %y = fusion.linear %x, %w, %b : (!t, !m, !v) -> !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]>
  func.return %y : !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]>
}

// CHECK-LABEL: func.func @linear(
// CHECK-NEXT:    %[[S:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[M:[^ ]+]] = hir.dim %x, 1
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %w, 0
// CHECK-NEXT:    %[[NB:[^ ]+]] = hir.dim %b, 0
// CHECK-NEXT:    %[[NY:[^ ]+]] = arith.maxui %[[N]], %[[NB]] : index
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[S]], %[[M]], %[[NY]])
// CHECK-NEXT:    hir.linear ins(%x, %w, %b : {{.*}}) outs(%[[Y]] : {{.*}})
// CHECK-NEXT:    func.return %[[Y]]

func.func @single_binary(%x: !m, %y: !m) -> !ms {
  %z = fusion.add %x, %y : (!m, !m) -> !ms
  func.return %z : !ms
}

// CHECK-LABEL: func.func private @single_binary_segment_0(
// CHECK-NEXT:    %z = fusion.add %x, %y
// CHECK-NEXT:    func.return %z
// CHECK-LABEL: func.func @single_binary(
// CHECK-NEXT:    %[[X0:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[Y0:[^ ]+]] = hir.dim %y, 0
// CHECK-NEXT:    %[[X1:[^ ]+]] = hir.dim %x, 1
// CHECK-NEXT:    %[[Y1:[^ ]+]] = hir.dim %y, 1
// CHECK-NEXT:    %[[Z0:[^ ]+]] = arith.maxui %[[X0]], %[[Y0]] : index
// CHECK-NEXT:    %[[Z1:[^ ]+]] = arith.maxui %[[X1]], %[[Y1]] : index
// CHECK-NEXT:    %[[Z:[^ ]+]] = hir.allocate(%[[Z0]], %[[Z1]]) : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
// CHECK-NEXT:    hir.launch_kernel @single_binary_segment_0 ins(%x, %y : {{.*}}) outs(%[[Z]] : {{.*}})
// CHECK-NEXT:    func.return %[[Z]]
