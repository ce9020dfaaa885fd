// RUN: hir-opt %s -p 'hir-lowering{per_stream_buffers=false}' | filecheck %s --check-prefixes=CHECK,NCCL
// RUN: hir-opt %s -p 'hir-lowering{backend=cuda per_stream_buffers=false}' | filecheck %s --check-prefixes=CHECK,CUDA
// RUN: hir-opt %s -p 'hir-lowering{backend=cuda per_stream_buffers=false}' | filecheck %s --check-prefix=NOCOPY
// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefix=PER

// pr4387's matmul_AR on a mesh of 8: a matmul sharded along K whose partial sums are
// allreduced chunk by chunk. Both run in one loop: the allreduce of chunk i reads
// the slice the matmul of chunk i just wrote. The partial sums are freed after it.
// With the copy engines (backend=cuda) peers read the partial sums: the program
// computes them and does not return them, so they are allocated symmetric in place,
// with no copy, and each chunk's allreduce reads a slice of that symmetric buffer.
// A [S, DIDx(8), M, K/8] @ B [DIDx(8), K/8, N] -> [Stream(S), DIDx(8), M, N]
// -> sum(1) -> [Stream(S), M, N].

!a = !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>
!b = !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
!partial = !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _, _]>
!out = !fusion.tensor<[?, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _]>

func.func @matmul_ar(%a: !a, %b: !b) -> !out {
  %partial = fusion.matmul %a, %b : (!a, !b) -> !partial
  %out = fusion.sum %partial [1] : !partial -> !out
  func.return %out : !out
}

// NOCOPY-NOT:   hir.copy
// CHECK-LABEL: func.func @matmul_ar(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>, %[[B:[^:]+]]: !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>)
// NCCL:          %[[P:[^ ]+]] = hir.allocate({{.*}}) : !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _, _]>
// CUDA:          %[[P:[^ ]+]] = hir.allocate({{.*}}) symmetric : !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _, _]>
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[P]], 0
// CHECK-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// CHECK:           %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
// CHECK-NEXT:      %[[P_I:[^ ]+]] = hir.alias_select %[[P]][0 = %[[I]]]
// CHECK-NEXT:      hir.matmul ins(%[[A_I]], %[[B]] : {{.*}}) outs(%[[P_I]] :
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// NCCL-NEXT:       %[[W:[^ ]+]] = hir.allreduce %[[P_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend nccl
// CUDA-NEXT:       %[[W:[^ ]+]] = hir.allreduce %[[P_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend cuda
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    hir.deallocate %[[P]]
// CHECK-NEXT:    func.return %[[OUT]]

// The default pipeline gives the partial sums one slice per stream (per-stream-buffers,
// pr4147's suggested optimisation): iteration i uses slice i mod number_of_streams.

// PER-LABEL: func.func @matmul_ar(
// PER:         %[[SLOTS:[^ ]+]] = arith.minui %{{[^ ]+}}, %{{[^ ]+}} : index
// PER-NEXT:    %[[BUF:[^ ]+]] = hir.allocate(%[[SLOTS]],
// PER:         scf.for
// PER:         scf.for
// PER-NEXT:      %[[SI:[^ ]+]] = arith.remui
// PER:           %[[BUF_I:[^ ]+]] = hir.alias_select %[[BUF]][0 = %[[SI]]]
// PER-NEXT:      hir.matmul ins({{.*}}) outs(%[[BUF_I]] :
// PER:           hir.allreduce %[[BUF_I]] into
