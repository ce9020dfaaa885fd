// RUN: hir-opt %s -p 'hir-lowering{per_stream_buffers=false allreduce_in_place=false}' | filecheck %s --check-prefixes=CHECK,NCCL
// RUN: hir-opt %s -p 'hir-lowering{backend=cuda per_stream_buffers=false copy_engine_pipelining=false}' | filecheck %s --check-prefixes=CHECK,CUDA
// RUN: hir-opt %s -p 'hir-lowering{backend=cuda}' | filecheck %s --check-prefixes=NOCOPY,PIPE
// RUN: hir-opt %s -p 'hir-lowering{allreduce_in_place=false}' | filecheck %s --check-prefix=PER
// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefix=INPLACE

// pr4387's matmul_AR on a mesh of 8: a matmul sharded along K whose partial sums are
// allreduced chunk by chunk. Both run in one loop: the allreduce of chunk i reads
// the slice the matmul of chunk i just wrote. The partial sums are freed after it.
// With the copy engines (backend=cuda) peers read the partial sums: the program
// computes them and does not return them, so they are allocated symmetric in place,
// with no copy, and each chunk's allreduce reads a slice of that symmetric buffer. By
// default (copy-engine-pipelining) that loop runs on the caller's stream: iteration i
// computes chunk i and issues its allreduce, then waits for chunk i - 1's (PIPE), so
// the GEMMs run one after the other while the previous chunk is in flight.
// By default (allreduce-in-place, INPLACE) the NCCL program has no partial-sums buffer:
// each chunk's GEMM writes into the output's slice, seen as the partial sums, and the
// allreduce sums it there in place (NCCL sums in the buffer it is given: a separate
// input would be copied into the output first).
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
// NCCL:          %[[P:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}) : !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _, _]>
// CUDA:          %[[P:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
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

// INPLACE-LABEL: func.func @matmul_ar(
// INPLACE-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>, %[[B:[^:]+]]: !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>)
// INPLACE-NOT:     hir.copy
// INPLACE:         %[[OUT:[^ ]+]] = hir.allocate({{.*}}) : !fusion.tensor<[?, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _]>
// INPLACE:         scf.for
// INPLACE:           hir.synchronize_stream %{{.*}}
// INPLACE-NEXT:    }
// INPLACE-NEXT:    scf.for %[[I:[^ ]+]] =
// INPLACE:           %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]]
// INPLACE-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// INPLACE-NEXT:      %[[P_I:[^ ]+]] = hir.allocate({{.*}}) : !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
// INPLACE-NEXT:      hir.aten "aten.alias.default"(%[[OUT_I]]) ins(%[[OUT_I]] : {{.*}}) outs(%[[P_I]] : {{.*}}) adopted [0]
// INPLACE-NEXT:      hir.matmul ins(%[[A_I]], %[[B]] : {{.*}}) outs(%[[P_I]] :
// INPLACE-NEXT:      %[[W:[^ ]+]] = hir.allreduce %[[P_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend nccl
// INPLACE-NEXT:      hir.wait %[[W]]
// INPLACE-NEXT:      hir.deallocate %[[P_I]]
// INPLACE-NOT:     hir.allocate
// INPLACE:         func.return %[[OUT]]

// PIPE-LABEL: func.func @matmul_ar(
// PIPE-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>, %[[B:[^:]+]]: !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>)
// PIPE-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// PIPE-DAG:     %[[C1:[^ ]+]] = arith.constant 1 : index
// PIPE:         %[[P:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// PIPE-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// PIPE-NEXT:    %[[NONEMPTY:[^ ]+]] = arith.cmpi ugt, %[[N]], %[[C0]] : index
// PIPE-NEXT:    scf.if %[[NONEMPTY]] {
// PIPE-NEXT:      %[[A_0:[^ ]+]] = hir.alias_select %[[A]][0 = %[[C0]]]
// PIPE-NEXT:      %[[P_0:[^ ]+]] = hir.alias_select %[[P]][0 = %[[C0]]]
// PIPE-NEXT:      hir.matmul ins(%[[A_0]], %[[B]] : {{.*}}) outs(%[[P_0]] :
// PIPE-NEXT:      %[[OUT_0:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[C0]]]
// PIPE-NEXT:      %[[W0:[^ ]+]] = hir.allreduce %[[P_0]] into %[[OUT_0]] {{.*}} backend cuda
// PIPE-NEXT:      %[[LAST:[^ ]+]] = scf.for %[[I:[^ ]+]] = %[[C1]] to %[[N]] step %[[C1]] iter_args(%[[PREVIOUS:[^ ]+]] = %[[W0]]) -> (!hir.work) {
// PIPE-NEXT:        %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]]
// PIPE-NEXT:        %[[P_I:[^ ]+]] = hir.alias_select %[[P]][0 = %[[I]]]
// PIPE-NEXT:        hir.matmul ins(%[[A_I]], %[[B]] : {{.*}}) outs(%[[P_I]] :
// PIPE-NEXT:        %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// PIPE-NEXT:        %[[W:[^ ]+]] = hir.allreduce %[[P_I]] into %[[OUT_I]] {{.*}} backend cuda
// PIPE-NEXT:        hir.wait %[[PREVIOUS]]
// PIPE-NEXT:        scf.yield %[[W]] : !hir.work
// PIPE-NEXT:      }
// PIPE-NEXT:      hir.wait %[[LAST]]
// PIPE-NEXT:    } else {
// PIPE-NEXT:    }
// PIPE-NEXT:    hir.deallocate %[[P]]
// PIPE-NEXT:    func.return %[[OUT]]
