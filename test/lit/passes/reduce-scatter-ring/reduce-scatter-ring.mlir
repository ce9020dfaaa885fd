// RUN: hir-opt %s --split-input-file -p reduce-scatter-ring | filecheck %s
// RUN: hir-opt %s --split-input-file -p reduce-scatter-ring > %t && hir-opt %s --split-input-file -p reduce-scatter-ring,reduce-scatter-ring | diff %t -
// RUN: hir-opt %s --split-input-file -p 'reduce-scatter-ring{explain=true}' 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK

// GEMM+RS over four devices on the copy engines: at step t (1 to 3) each device computes
// the rows of the member t ahead into slice t of the partial product (the slice every
// device sends at step t, so the one each reads on its peer), sends them, and receives
// from the member t behind the rows it computed for this device, into that member's
// slice of a staging buffer; its own rows go into its own slice while the last transfer
// travels, and after the waits one reduction adds the four slices into the output. The
// staging buffer is allocated with the partial product's buffer.
// W's broadcast axis is sliced at 0, once for every matmul; the positions come before
// everything else.

!x = !fusion.tensor<[4, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _, _, _]>
!w = !fusion.tensor<[4, 1, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _, _, _]>
!p = !fusion.tensor<[4, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _, _, _]>
!y = !fusion.tensor<[4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _, _]>

func.func @matmul_rs(%x: !x, %w: !w) -> !y {
  %m = hir.dim %x, 2 : !x
  %n = hir.dim %w, 3 : !w
  %partial = hir.allocate(%m, %n) symmetric : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%partial : !p)
  %y = hir.allocate(%m, %n) : !y
  %work = hir.reduce_scatter %partial into %y team [0, 1, 2, 3] op sum backend cuda : !p, !y
  hir.wait %work
  hir.deallocate %partial : !p
  func.return %y : !y
}

// CHECK-LABEL: func.func @matmul_rs(
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-DAG:     %[[C1:[^ ]+]] = arith.constant 1 : index
// CHECK-DAG:     %[[C2:[^ ]+]] = arith.constant 2 : index
// CHECK-DAG:     %[[C3:[^ ]+]] = arith.constant 3 : index
// CHECK-DAG:     %[[C4:[^ ]+]] = arith.constant 4 : index
// CHECK:         %[[RANK:[^ ]+]] = hir.device_index
// CHECK-NEXT:    %[[PLUS1:[^ ]+]] = arith.addi %[[RANK]], %[[C1]] : index
// CHECK-NEXT:    %[[AHEAD1:[^ ]+]] = arith.remui %[[PLUS1]], %[[C4]] : index
// CHECK-NEXT:    %[[PLUS2:[^ ]+]] = arith.addi %[[RANK]], %[[C2]] : index
// CHECK-NEXT:    %[[AHEAD2:[^ ]+]] = arith.remui %[[PLUS2]], %[[C4]] : index
// CHECK-NEXT:    %[[PLUS3:[^ ]+]] = arith.addi %[[RANK]], %[[C3]] : index
// CHECK-NEXT:    %[[AHEAD3:[^ ]+]] = arith.remui %[[PLUS3]], %[[C4]] : index
// CHECK:         %[[PARTIAL:[^ ]+]] = hir.allocate({{.*}}) symmetric
// CHECK-NEXT:    %[[STAGING:[^ ]+]] = hir.allocate({{.*}}) : !fusion.tensor<[4, 4, ?, ?], bf16
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[X1:[^ ]+]] = hir.alias_select %x[1 = %[[AHEAD1]]]
// CHECK-NEXT:    %[[W0:[^ ]+]] = hir.alias_select %w[1 = %[[C0]]]
// CHECK-NEXT:    %[[TO1:[^ ]+]] = hir.alias_select %[[PARTIAL]][1 = %[[C1]]]
// CHECK-NEXT:    hir.matmul ins(%[[X1]], %[[W0]] : {{.*}}) outs(%[[TO1]] :
// CHECK-NEXT:    %[[FROM1:[^ ]+]] = hir.alias_select %[[STAGING]][1 = %[[AHEAD3]]]
// CHECK-NEXT:    hir.start_coalescing
// CHECK-NEXT:    %{{.*}} = hir.send %[[TO1]] to %[[AHEAD1]] backend cuda
// CHECK-NEXT:    %{{.*}} = hir.recv %[[FROM1]] from %[[AHEAD3]] backend cuda
// CHECK-NEXT:    %[[WORK1:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:    %[[X2:[^ ]+]] = hir.alias_select %x[1 = %[[AHEAD2]]]
// CHECK-NEXT:    %[[TO2:[^ ]+]] = hir.alias_select %[[PARTIAL]][1 = %[[C2]]]
// CHECK-NEXT:    hir.matmul ins(%[[X2]], %[[W0]] : {{.*}}) outs(%[[TO2]] :
// CHECK-NEXT:    %[[FROM2:[^ ]+]] = hir.alias_select %[[STAGING]][1 = %[[AHEAD2]]]
// CHECK-NEXT:    hir.start_coalescing
// CHECK-NEXT:    %{{.*}} = hir.send %[[TO2]] to %[[AHEAD2]] backend cuda
// CHECK-NEXT:    %{{.*}} = hir.recv %[[FROM2]] from %[[AHEAD2]] backend cuda
// CHECK-NEXT:    %[[WORK2:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:    %[[X3:[^ ]+]] = hir.alias_select %x[1 = %[[AHEAD3]]]
// CHECK-NEXT:    %[[TO3:[^ ]+]] = hir.alias_select %[[PARTIAL]][1 = %[[C3]]]
// CHECK-NEXT:    hir.matmul ins(%[[X3]], %[[W0]] : {{.*}}) outs(%[[TO3]] :
// CHECK-NEXT:    %[[FROM3:[^ ]+]] = hir.alias_select %[[STAGING]][1 = %[[AHEAD1]]]
// CHECK-NEXT:    hir.start_coalescing
// CHECK-NEXT:    %{{.*}} = hir.send %[[TO3]] to %[[AHEAD3]] backend cuda
// CHECK-NEXT:    %{{.*}} = hir.recv %[[FROM3]] from %[[AHEAD1]] backend cuda
// CHECK-NEXT:    %[[WORK3:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:    %[[XOWN:[^ ]+]] = hir.alias_select %x[1 = %[[RANK]]]
// CHECK-NEXT:    %[[OWN:[^ ]+]] = hir.alias_select %[[STAGING]][1 = %[[RANK]]]
// CHECK-NEXT:    hir.matmul ins(%[[XOWN]], %[[W0]] : {{.*}}) outs(%[[OWN]] :
// CHECK-NEXT:    hir.wait %[[WORK1]]
// CHECK-NEXT:    hir.wait %[[WORK2]]
// CHECK-NEXT:    hir.wait %[[WORK3]]
// CHECK-NEXT:    hir.reduction "sum" [1] ins(%[[STAGING]] : {{.*}}) outs(%[[Y]] :
// CHECK-NEXT:    hir.deallocate %[[PARTIAL]]
// CHECK-NOT:     hir.reduce_scatter

// -----

// A team of three devices that are not 0 to 2, with W sliced per member: a position is
// the rank less the first device, a member's device its position plus the first.

!x = !fusion.tensor<[3, 3, ?, ?], f32, mesh = [1, 2, 3], axes = [didx, _, _, _]>
!w = !fusion.tensor<[3, 3, ?, ?], f32, mesh = [1, 2, 3], axes = [didx, _, _, _]>
!p = !fusion.tensor<[3, 3, ?, ?], f32, mesh = [1, 2, 3], axes = [didx, _, _, _]>
!y = !fusion.tensor<[3, ?, ?], f32, mesh = [1, 2, 3], axes = [didx, _, _]>

func.func @team_1_to_3(%x: !x, %w: !w, %y: !y) {
  %m = hir.dim %x, 2 : !x
  %n = hir.dim %w, 3 : !w
  %partial = hir.allocate(%m, %n) symmetric : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%partial : !p)
  %work = hir.reduce_scatter %partial into %y team [1, 2, 3] op sum backend cuda : !p, !y
  hir.wait %work
  func.return
}

// CHECK-LABEL: func.func @team_1_to_3(
// CHECK-DAG:     %[[C1:[^ ]+]] = arith.constant 1 : index
// CHECK-DAG:     %[[C2:[^ ]+]] = arith.constant 2 : index
// CHECK-DAG:     %[[C3:[^ ]+]] = arith.constant 3 : index
// CHECK:         %[[RANK:[^ ]+]] = hir.device_index
// CHECK-NEXT:    %[[OWN:[^ ]+]] = arith.subi %[[RANK]], %[[C1]] : index
// CHECK-NEXT:    %[[PLUS1:[^ ]+]] = arith.addi %[[OWN]], %[[C1]] : index
// CHECK-NEXT:    %[[AHEAD1:[^ ]+]] = arith.remui %[[PLUS1]], %[[C3]] : index
// CHECK-NEXT:    %[[DEVICE1:[^ ]+]] = arith.addi %[[AHEAD1]], %[[C1]] : index
// CHECK-NEXT:    %[[PLUS2:[^ ]+]] = arith.addi %[[OWN]], %[[C2]] : index
// CHECK-NEXT:    %[[AHEAD2:[^ ]+]] = arith.remui %[[PLUS2]], %[[C3]] : index
// CHECK-NEXT:    %[[DEVICE2:[^ ]+]] = arith.addi %[[AHEAD2]], %[[C1]] : index
// CHECK:         %[[STAGING:[^ ]+]] = hir.allocate({{.*}}) : !fusion.tensor<[3, 3, ?, ?], f32
// CHECK-NEXT:    %[[X1:[^ ]+]] = hir.alias_select %x[1 = %[[AHEAD1]]]
// CHECK-NEXT:    %[[W1:[^ ]+]] = hir.alias_select %w[1 = %[[AHEAD1]]]
// CHECK-NEXT:    %[[TO1:[^ ]+]] = hir.alias_select %{{.*}}[1 = %[[C1]]]
// CHECK-NEXT:    hir.matmul ins(%[[X1]], %[[W1]] : {{.*}}) outs(%[[TO1]] :
// CHECK-NEXT:    %[[FROM1:[^ ]+]] = hir.alias_select %[[STAGING]][1 = %[[AHEAD2]]]
// CHECK-NEXT:    hir.start_coalescing
// CHECK-NEXT:    %{{.*}} = hir.send %[[TO1]] to %[[DEVICE1]] backend cuda
// CHECK-NEXT:    %{{.*}} = hir.recv %[[FROM1]] from %[[DEVICE2]] backend cuda
// CHECK:         hir.send %{{.*}} to %[[DEVICE2]] backend cuda
// CHECK-NEXT:    hir.recv %{{.*}} from %[[DEVICE1]] backend cuda
// CHECK:         %[[XOWN:[^ ]+]] = hir.alias_select %x[1 = %[[OWN]]]
// CHECK-NEXT:    %[[WOWN:[^ ]+]] = hir.alias_select %w[1 = %[[OWN]]]
// CHECK-NEXT:    %[[OWNROWS:[^ ]+]] = hir.alias_select %[[STAGING]][1 = %[[OWN]]]
// CHECK-NEXT:    hir.matmul ins(%[[XOWN]], %[[WOWN]] : {{.*}}) outs(%[[OWNROWS]] :
// CHECK:         hir.reduction "sum" [1] ins(%[[STAGING]] : {{.*}}) outs(%y :
// CHECK-NOT:     hir.reduce_scatter

// -----

// Left as they are, each copy-engine one saying why with `explain=true`: a team of two
// (reduce-scatter-in-matmul's), a team whose devices are not consecutive; and an NCCL
// reduce-scatter, not the pass's: no remark.

// REMARK: reduce-scatter-ring.mlir:[[# @LINE + 23]]:3: remark: reduce-scatter-ring leaves this hir.reduce_scatter: its team has 2 member(s); the ring is one of 3 or more
// REMARK-NEXT: reduce-scatter-ring.mlir:[[# @LINE + 26]]:3: remark: reduce-scatter-ring leaves this hir.reduce_scatter: its team [0, 2, 3] is not consecutive devices
// REMARK-NEXT: reduce-scatter-ring.mlir:{{[0-9]+}}:3: remark: reduce-scatter-ring leaves this hir.reduce_scatter: its input is not a matmul's product
// REMARK-NOT: remark

!x2 = !fusion.tensor<[2, 2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!w2 = !fusion.tensor<[2, 1, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!p2 = !fusion.tensor<[2, 2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!y2 = !fusion.tensor<[2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
!x3 = !fusion.tensor<[3, 3, ?, ?], f32, mesh = [0, 2, 3], axes = [didx, _, _, _]>
!w3 = !fusion.tensor<[3, 1, ?, ?], f32, mesh = [0, 2, 3], axes = [didx, _, _, _]>
!p3 = !fusion.tensor<[3, 3, ?, ?], f32, mesh = [0, 2, 3], axes = [didx, _, _, _]>
!y3 = !fusion.tensor<[3, ?, ?], f32, mesh = [0, 2, 3], axes = [didx, _, _]>
!x4 = !fusion.tensor<[4, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _, _]>
!w4 = !fusion.tensor<[4, 1, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _, _]>
!p4 = !fusion.tensor<[4, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _, _]>
!y4 = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>

func.func @left(%x2: !x2, %w2: !w2, %y2: !y2, %x3: !x3, %w3: !w3, %y3: !y3, %x4: !x4, %w4: !w4, %y4: !y4) {
  %m = hir.dim %x2, 2 : !x2
  %n = hir.dim %w2, 3 : !w2
  %p2 = hir.allocate(%m, %n) symmetric : !p2
  hir.matmul ins(%x2, %w2 : !x2, !w2) outs(%p2 : !p2)
  %pair = hir.reduce_scatter %p2 into %y2 team [0, 1] op sum backend cuda : !p2, !y2
  hir.wait %pair
  %p3 = hir.allocate(%m, %n) symmetric : !p3
  hir.matmul ins(%x3, %w3 : !x3, !w3) outs(%p3 : !p3)
  %gap = hir.reduce_scatter %p3 into %y3 team [0, 2, 3] op sum backend cuda : !p3, !y3
  hir.wait %gap
  %p4 = hir.allocate(%m, %n) : !p4
  hir.matmul ins(%x4, %w4 : !x4, !w4) outs(%p4 : !p4)
  %nccl = hir.reduce_scatter %p4 into %y4 team [0, 1, 2, 3] op sum backend nccl : !p4, !y4
  hir.wait %nccl
  func.return
}

// CHECK-LABEL: func.func @left(
// CHECK-NOT:     hir.send
// CHECK:         hir.reduce_scatter {{.*}} team [0, 1] op sum backend cuda
// CHECK:         hir.reduce_scatter {{.*}} team [0, 2, 3] op sum backend cuda
// CHECK:         hir.reduce_scatter {{.*}} team [0, 1, 2, 3] op sum backend nccl
// CHECK-NOT:     hir.send

// -----

// The input gradient of two projections, dx = dq @ wq + dk @ wk, reduce-scattered over
// three devices: each member's rows are dq's slice times wq, and dk's slice times wk
// added into them (`accumulate`); the products, their sum, the add kernel and its
// segment are gone.

!d = !fusion.tensor<[3, 3, ?, ?], f32, mesh = [0, 1, 2], axes = [didx, _, _, _]>
!w = !fusion.tensor<[3, 1, ?, ?], f32, mesh = [0, 1, 2], axes = [didx, _, _, _]>
!p = !fusion.tensor<[3, 3, ?, ?], f32, mesh = [0, 1, 2], axes = [didx, _, _, _]>
!y = !fusion.tensor<[3, ?, ?], f32, mesh = [0, 1, 2], axes = [didx, _, _]>

func.func private @add(%a: !p, %b: !p) -> !p {
  %sum = fusion.add %a, %b : (!p, !p) -> !p
  func.return %sum : !p
}

func.func @two_projections(%dq: !d, %wq: !w, %dk: !d, %wk: !w, %y: !y) {
  %m = hir.dim %dq, 2 : !d
  %n = hir.dim %wq, 3 : !w
  %q = hir.allocate(%m, %n) : !p
  hir.matmul ins(%dq, %wq : !d, !w) outs(%q : !p)
  %k = hir.allocate(%m, %n) : !p
  hir.matmul ins(%dk, %wk : !d, !w) outs(%k : !p)
  %partial = hir.allocate(%m, %n) symmetric : !p
  hir.launch_kernel @add ins(%q, %k : !p, !p) outs(%partial : !p)
  %work = hir.reduce_scatter %partial into %y team [0, 1, 2] op sum backend cuda : !p, !y
  hir.wait %work
  func.return
}


// CHECK-LABEL: func.func @two_projections(
// CHECK:         %[[PARTIAL:[^ ]+]] = hir.allocate({{.*}}) symmetric
// CHECK:         %[[STAGING:[^ ]+]] = hir.allocate({{.*}}) : !fusion.tensor<[3, 3, ?, ?], f32
// CHECK-NEXT:    %[[DQ1:[^ ]+]] = hir.alias_select %dq[1 = %[[AHEAD1:[^ ]+]]]
// CHECK-NEXT:    %[[WQ:[^ ]+]] = hir.alias_select %wq[1 = %[[C0:[^ ]+]]]
// CHECK-NEXT:    %[[DK1:[^ ]+]] = hir.alias_select %dk[1 = %[[AHEAD1]]]
// CHECK-NEXT:    %[[WK:[^ ]+]] = hir.alias_select %wk[1 = %[[C0]]]
// CHECK-NEXT:    %[[TO1:[^ ]+]] = hir.alias_select %[[PARTIAL]][1 = %{{.*}}]
// CHECK-NEXT:    hir.matmul ins(%[[DQ1]], %[[WQ]] : {{.*}}) outs(%[[TO1]] :
// CHECK-NEXT:    hir.matmul accumulate ins(%[[DK1]], %[[WK]] : {{.*}}) outs(%[[TO1]] :
// CHECK:         %[[OWN:[^ ]+]] = hir.alias_select %[[STAGING]][1 = %rank]
// CHECK-NEXT:    hir.matmul ins(%{{.*}}, %[[WQ]] : {{.*}}) outs(%[[OWN]] :
// CHECK-NEXT:    hir.matmul accumulate ins(%{{.*}}, %[[WK]] : {{.*}}) outs(%[[OWN]] :
// CHECK:         hir.reduction "sum" [1] ins(%[[STAGING]] : {{.*}}) outs(%y :
// CHECK-NOT:     hir.launch_kernel
// CHECK-NOT:     hir.reduce_scatter

// A product added to itself is left as it is (its one matmul would be computed twice), with
// a remark (above, the last).

func.func @doubled(%dq: !d, %wq: !w, %y: !y) {
  %m = hir.dim %dq, 2 : !d
  %n = hir.dim %wq, 3 : !w
  %q = hir.allocate(%m, %n) : !p
  hir.matmul ins(%dq, %wq : !d, !w) outs(%q : !p)
  %partial = hir.allocate(%m, %n) symmetric : !p
  hir.launch_kernel @add ins(%q, %q : !p, !p) outs(%partial : !p)
  %work = hir.reduce_scatter %partial into %y team [0, 1, 2] op sum backend cuda : !p, !y
  hir.wait %work
  func.return
}

// CHECK-LABEL: func.func @doubled(
// CHECK:         hir.launch_kernel @add ins(%q, %q
// CHECK-NEXT:    hir.reduce_scatter
