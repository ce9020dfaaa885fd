// RUN: hir-opt %S/../../../examples/allgather_p2p.mlir -p hir-lowering | filecheck %s --check-prefix=P2P
// RUN: hir-opt %S/../../../examples/ag_linear.mlir -p hir-lowering | filecheck %s --check-prefix=LINEAR

// The examples run on a mesh of 4 (`hir-run examples/<name>.mlir --nproc 4`): the
// same programs with teams, extents and peers of 4 devices.

// P2P-LABEL: func.func @allgather_p2p(
// P2P-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>)
// P2P-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// P2P-DAG:     %[[RANK:[^ ]+]] = hir.device_index
// P2P-DAG:     %[[C4:[^ ]+]] = arith.constant 4 : index
// P2P:         %[[OUT:[^ ]+]] = hir.allocate({{.*}}) : !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _]>
// P2P-NEXT:    %[[WRAPPED:[^ ]+]] = arith.addi %[[RANK]], %[[C4]] : index
// P2P-NEXT:    scf.for {{.*}} to %[[C4]]
// P2P:         scf.for %[[I:[^ ]+]] = {{.*}} to %[[C4]]
// P2P:           %[[AHEAD:[^ ]+]] = arith.addi %[[RANK]], %[[I]] : index
// P2P-NEXT:      %[[SLOT:[^ ]+]] = arith.remui %[[AHEAD]], %[[C4]] : index
// P2P-NEXT:      %[[OUT_S:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[SLOT]]]
// P2P-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[I]], %[[C0]] : index
// P2P-NEXT:      scf.if %[[OWN]] {
// P2P:           } else {
// P2P-NEXT:        %[[BEHIND:[^ ]+]] = arith.subi %[[WRAPPED]], %[[I]] : index
// P2P-NEXT:        %[[SEND_PEER:[^ ]+]] = arith.remui %[[BEHIND]], %[[C4]] : index
// P2P-NEXT:        hir.start_coalescing
// P2P-NEXT:        hir.recv %[[OUT_S]] from %[[SLOT]] backend nccl
// P2P-NEXT:        hir.send %[[IN]] to %[[SEND_PEER]] backend nccl

// LINEAR-LABEL: func.func @ag_linear(
// LINEAR:         scf.for
// LINEAR:         scf.for
// LINEAR:           hir.allgather %{{.*}} into %{{.*}} team [0, 1, 2, 3] backend nccl : !fusion.tensor<[4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _, _]>, !fusion.tensor<[4, ?, ?], bf16, mesh = [0, 1, 2, 3]>
// LINEAR-NEXT:      hir.wait
// LINEAR-NEXT:      hir.alias_select
// LINEAR-NEXT:      hir.linear
