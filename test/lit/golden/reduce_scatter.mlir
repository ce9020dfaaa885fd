// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefixes=CHECK,NCCL
// RUN: hir-opt %s -p 'hir-lowering{backend=cuda copy_engine_pipelining=false}' | filecheck %s --check-prefixes=CHECK,CUDA
// RUN: hir-opt %s -p 'hir-lowering{backend=cuda}' | filecheck %s --check-prefix=PIPE

// pr4387's ReduceScatter on a mesh of 8: [S, DIDx(8), 8, M] -> sum(1) ->
// [Stream(S), DIDx(8), M]. Each iteration reduce-scatters one slice. With the copy
// engines (backend=cuda) peers read the input, which the caller allocated: it is
// copied into a symmetric buffer once, before the loops, and each iteration
// reduce-scatters a slice of that copy. By default (copy-engine-pipelining) the loop
// then runs on the caller's stream, software-pipelined: iteration i issues the
// reduce-scatter of slice i, then waits for that of slice i - 1 (PIPE).

!in = !fusion.tensor<[?, 8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>
!out = !fusion.tensor<[?, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _]>

func.func @reduce_scatter(%in: !in) -> !out {
  %out = fusion.sum %in [1] : !in -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @reduce_scatter(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, 8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>)
// CUDA:          %[[STAGED:[^ ]+]] = hir.allocate({{.*}}) symmetric : !fusion.tensor<[?, 8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>
// CUDA-NEXT:     hir.copy ins(%[[IN]] : {{.*}}) outs(%[[STAGED]] :
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// NCCL:            %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
// CUDA:            %[[IN_I:[^ ]+]] = hir.alias_select %[[STAGED]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
// NCCL-NEXT:       %[[W:[^ ]+]] = hir.reduce_scatter %[[IN_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend nccl
// CUDA-NEXT:       %[[W:[^ ]+]] = hir.reduce_scatter %[[IN_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend cuda
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// NCCL-NEXT:     func.return %[[OUT]]
// CUDA-NEXT:     hir.deallocate %[[STAGED]]
// CUDA-NEXT:     func.return %[[OUT]]

// PIPE-LABEL: func.func @reduce_scatter(
// PIPE-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// PIPE-DAG:     %[[C1:[^ ]+]] = arith.constant 1 : index
// PIPE:         %[[STAGED:[^ ]+]] = hir.allocate({{.*}}) symmetric
// PIPE:         %[[OUT:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// PIPE-NEXT:    %[[NONEMPTY:[^ ]+]] = arith.cmpi ugt, %[[N]], %[[C0]] : index
// PIPE-NEXT:    scf.if %[[NONEMPTY]] {
// PIPE-NEXT:      %[[IN_0:[^ ]+]] = hir.alias_select %[[STAGED]][0 = %[[C0]]]
// PIPE-NEXT:      %[[OUT_0:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[C0]]]
// PIPE-NEXT:      %[[W0:[^ ]+]] = hir.reduce_scatter %[[IN_0]] into %[[OUT_0]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend cuda
// PIPE-NEXT:      %[[LAST:[^ ]+]] = scf.for %[[I:[^ ]+]] = %[[C1]] to %[[N]] step %[[C1]] iter_args(%[[PREVIOUS:[^ ]+]] = %[[W0]]) -> (!hir.work) {
// PIPE-NEXT:        %[[IN_I:[^ ]+]] = hir.alias_select %[[STAGED]][0 = %[[I]]]
// PIPE-NEXT:        %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// PIPE-NEXT:        %[[W:[^ ]+]] = hir.reduce_scatter %[[IN_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend cuda
// PIPE-NEXT:        hir.wait %[[PREVIOUS]]
// PIPE-NEXT:        scf.yield %[[W]] : !hir.work
// PIPE-NEXT:      }
// PIPE-NEXT:      hir.wait %[[LAST]]
// PIPE-NEXT:    } else {
// PIPE-NEXT:    }
// PIPE-NEXT:    hir.deallocate %[[STAGED]]
// PIPE-NEXT:    func.return %[[OUT]]
// PIPE-NOT:     hir.set_current_stream
