// RUN: hir-opt %s --split-input-file -p reduce-scatter-in-matmul | filecheck %s
// RUN: hir-opt %s --split-input-file -p reduce-scatter-in-matmul > %t && hir-opt %s --split-input-file -p reduce-scatter-in-matmul,reduce-scatter-in-matmul | diff %t -
// RUN: hir-opt %s --split-input-file -p 'reduce-scatter-in-matmul{explain=true}' 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK

// With `explain=true` each copy-engine reduce-scatter left as it is (below) says why, in
// order; NCCL's are not the pass's, and say nothing.
// REMARK:      remark: reduce-scatter-in-matmul leaves this hir.reduce_scatter: its team has 3 members; the exchange is one of a pair
// REMARK-NEXT: remark: {{.*}}: its reduction is not a sum
// REMARK-NEXT: remark: {{.*}}: its input is not a matmul's product, nor a sum of such products, that only the matmul (or the kernel that adds them) writes and only the reduce-scatter reads
// REMARK-NEXT: remark: {{.*}}: its work is not waited for once, in its block
// REMARK-NEXT: remark: {{.*}}: its team [0, 1] is not the mesh [0, 1, 2] of its input
// REMARK-NEXT: remark: {{.*}}: its input is not a matmul's product
// REMARK-NEXT: remark: {{.*}}: an op between the matmul and the wait writes or frees a buffer, which the matmul may read
// REMARK-COUNT-4: remark: {{.*}}: its input is not a matmul's product
// REMARK-COUNT-2: remark: {{.*}}: its scattered axis 1 is not a batch axis of the matmul that each operand holds whole with an extent of 1 or 2
// REMARK-NEXT: remark: {{.*}}: its input is not a matmul's product
// REMARK-NEXT: {{.*}}reduce-scatter-in-matmul.mlir:[[# @LINE + 287]]:3: remark: {{.*}}: its input is not a matmul's product
// REMARK-NOT:  remark

// GEMM+RS over two devices on the copy engines: each device computes the peer's rows
// into slice 0 of the partial product (the slice both devices send, so the one each
// reads on its peer) where the product was computed, lets the peer pull them into its
// output, and after the wait adds its own rows' product into that output
// (`accumulate`). W's broadcast axis is sliced at 0, once for both matmuls; the
// positions come before everything else.

!x = !fusion.tensor<[2, 2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _, _]>
!w = !fusion.tensor<[2, 1, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _, _]>
!p = !fusion.tensor<[2, 2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _, _]>
!y = !fusion.tensor<[2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _]>

func.func @matmul_rs(%x: !x, %w: !w) -> !y {
  %m = hir.dim %x, 2 : !x
  %n = hir.dim %w, 3 : !w
  %partial = hir.allocate(%m, %n) symmetric : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%partial : !p)
  %y = hir.allocate(%m, %n) : !y
  %work = hir.reduce_scatter %partial into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %work
  hir.deallocate %partial : !p
  func.return %y : !y
}

// CHECK-LABEL: func.func @matmul_rs(
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-DAG:     %[[C1:[^ ]+]] = arith.constant 1 : index
// CHECK:         %[[RANK:[^ ]+]] = hir.device_index
// CHECK-NEXT:    %[[SECOND:[^ ]+]] = arith.cmpi eq, %[[RANK]], %[[C1]] : index
// CHECK-NEXT:    %[[OWN:[^ ]+]] = arith.select %[[SECOND]], %[[C1]], %[[C0]] : index
// CHECK-NEXT:    %[[PEER:[^ ]+]] = arith.select %[[SECOND]], %[[C0]], %[[C1]] : index
// CHECK-NEXT:    %[[PEER_DEVICE:[^ ]+]] = arith.select %[[SECOND]], %[[C0]], %[[C1]] : index
// CHECK:         %[[PARTIAL:[^ ]+]] = hir.allocate({{.*}}) symmetric
// CHECK-NEXT:    %[[X_PEER:[^ ]+]] = hir.alias_select %x[1 = %[[PEER]]]
// CHECK-NEXT:    %[[W_0:[^ ]+]] = hir.alias_select %w[1 = %[[C0]]]
// CHECK-NEXT:    %[[TO_PEER:[^ ]+]] = hir.alias_select %[[PARTIAL]][1 = %[[C0]]]
// CHECK-NEXT:    hir.matmul ins(%[[X_PEER]], %[[W_0]] : {{.*}}) outs(%[[TO_PEER]] :
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.start_coalescing
// CHECK-NEXT:    %{{.*}} = hir.send %[[TO_PEER]] to %[[PEER_DEVICE]] backend cuda
// CHECK-NEXT:    %{{.*}} = hir.recv %[[Y]] from %[[PEER_DEVICE]] backend cuda
// CHECK-NEXT:    %[[BATCH:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:    hir.wait %[[BATCH]]
// CHECK-NEXT:    %[[X_OWN:[^ ]+]] = hir.alias_select %x[1 = %[[OWN]]]
// CHECK-NEXT:    hir.matmul accumulate ins(%[[X_OWN]], %[[W_0]] : {{.*}}) outs(%[[Y]] :
// CHECK-NEXT:    hir.deallocate %[[PARTIAL]]
// CHECK-NOT:     hir.reduce_scatter

// -----

// A team of two devices that are not 0 and 1: the peer is the other device of the team,
// the positions 0 and 1 in it. W without the scattered axis is used whole.

!x = !fusion.tensor<[2, 2, ?, ?], bf16, mesh = [2, 5], axes = [didx, _, _, _]>
!w = !fusion.tensor<[?, ?], bf16, mesh = [2, 5]>
!p = !fusion.tensor<[2, 2, ?, ?], bf16, mesh = [2, 5], axes = [didx, _, _, _]>
!y = !fusion.tensor<[2, ?, ?], bf16, mesh = [2, 5], axes = [didx, _, _]>

func.func @team_2_5(%x: !x, %w: !w, %y: !y) {
  %m = hir.dim %x, 2 : !x
  %n = hir.dim %w, 1 : !w
  %partial = hir.allocate(%m, %n) symmetric : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%partial : !p)
  %work = hir.reduce_scatter %partial into %y team [2, 5] op sum backend cuda : !p, !y
  hir.wait %work
  func.return
}

// CHECK-LABEL: func.func @team_2_5(
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-DAG:     %[[C1:[^ ]+]] = arith.constant 1 : index
// CHECK-DAG:     %[[C2:[^ ]+]] = arith.constant 2 : index
// CHECK-DAG:     %[[C5:[^ ]+]] = arith.constant 5 : index
// CHECK:         %[[SECOND:[^ ]+]] = arith.cmpi eq, %{{.*}}, %[[C5]] : index
// CHECK-NEXT:    %[[OWN:[^ ]+]] = arith.select %[[SECOND]], %[[C1]], %[[C0]] : index
// CHECK-NEXT:    %[[PEER:[^ ]+]] = arith.select %[[SECOND]], %[[C0]], %[[C1]] : index
// CHECK-NEXT:    %[[PEER_DEVICE:[^ ]+]] = arith.select %[[SECOND]], %[[C2]], %[[C5]] : index
// CHECK:         %[[X_PEER:[^ ]+]] = hir.alias_select %x[1 = %[[PEER]]]
// CHECK:         hir.matmul ins(%[[X_PEER]], %w : {{.*}}) outs(
// CHECK:         hir.send %{{.*}} to %[[PEER_DEVICE]] backend cuda
// CHECK-NEXT:    hir.recv %y from %[[PEER_DEVICE]] backend cuda
// CHECK:         %[[X_OWN:[^ ]+]] = hir.alias_select %x[1 = %[[OWN]]]
// CHECK-NEXT:    hir.matmul accumulate ins(%[[X_OWN]], %w : {{.*}}) outs(%y :

// -----

// A vector rhs: the scattered axis 1 of the product is axis 1 of x (matmul's batch axes
// align on the right, and the vector has none).

!x = !fusion.tensor<[2, 2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _, _]>
!v = !fusion.tensor<[?], bf16, mesh = [0, 1]>
!p = !fusion.tensor<[2, 2, ?], bf16, mesh = [0, 1], axes = [didx, _, _]>
!y = !fusion.tensor<[2, ?], bf16, mesh = [0, 1], axes = [didx, _]>

func.func @vector_rhs(%x: !x, %v: !v, %y: !y) {
  %m = hir.dim %x, 2 : !x
  %partial = hir.allocate(%m) symmetric : !p
  hir.matmul ins(%x, %v : !x, !v) outs(%partial : !p)
  %work = hir.reduce_scatter %partial into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %work
  func.return
}

// CHECK-LABEL: func.func @vector_rhs(
// CHECK:         %[[OWN:[^ ]+]] = arith.select
// CHECK-NEXT:    %[[PEER:[^ ]+]] = arith.select
// CHECK:         %[[X_PEER:[^ ]+]] = hir.alias_select %x[1 = %[[PEER]]]
// CHECK:         hir.matmul ins(%[[X_PEER]], %v :
// CHECK:         %[[X_OWN:[^ ]+]] = hir.alias_select %x[1 = %[[OWN]]]
// CHECK-NEXT:    hir.matmul accumulate ins(%[[X_OWN]], %v :

// -----

// Left alone: a team of three (a ring of accumulating matmuls would serve it), a
// reduction that is not a sum, NCCL, a product that something else reads, a wait in
// another block, a team of two in a product of three devices (the third would have no
// peer), a product in a buffer that another view of it reads, and an operand written
// between the matmul and the wait (the rewrite would read it after that write).

!x3 = !fusion.tensor<[3, 3, ?, ?], bf16, mesh = [0, 1, 2], axes = [didx, _, _, _]>
!w3 = !fusion.tensor<[?, ?], bf16, mesh = [0, 1, 2]>
!p3 = !fusion.tensor<[3, 3, ?, ?], bf16, mesh = [0, 1, 2], axes = [didx, _, _, _]>
!y3 = !fusion.tensor<[3, ?, ?], bf16, mesh = [0, 1, 2], axes = [didx, _, _]>
!x = !fusion.tensor<[2, 2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _, _]>
!w = !fusion.tensor<[?, ?], bf16, mesh = [0, 1]>
!p = !fusion.tensor<[2, 2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _, _]>
!y = !fusion.tensor<[2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _]>

!xm = !fusion.tensor<[3, 2, ?, ?], bf16, mesh = [0, 1, 2], axes = [didx, _, _, _]>
!pm = !fusion.tensor<[3, 2, ?, ?], bf16, mesh = [0, 1, 2], axes = [didx, _, _, _]>
!ym = !fusion.tensor<[3, ?, ?], bf16, mesh = [0, 1, 2], axes = [didx, _, _]>

func.func @left_alone(%x3: !x3, %w3: !w3, %y3: !y3, %x: !x, %w: !w, %y: !y, %copy: !p, %c: i1,
                      %xm: !xm, %ym: !ym, %copy2: !p, %k: index) {
  %m = hir.dim %x, 2 : !x
  %n = hir.dim %w, 1 : !w
  %p3 = hir.allocate(%m, %n) symmetric : !p3
  hir.matmul ins(%x3, %w3 : !x3, !w3) outs(%p3 : !p3)
  %w1 = hir.reduce_scatter %p3 into %y3 team [0, 1, 2] op sum backend cuda : !p3, !y3
  hir.wait %w1
  %p_max = hir.allocate(%m, %n) symmetric : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%p_max : !p)
  %w2 = hir.reduce_scatter %p_max into %y team [0, 1] op max backend cuda : !p, !y
  hir.wait %w2
  %p_nccl = hir.allocate(%m, %n) : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%p_nccl : !p)
  %w3_ = hir.reduce_scatter %p_nccl into %y team [0, 1] op sum backend nccl : !p, !y
  hir.wait %w3_
  %p_read = hir.allocate(%m, %n) symmetric : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%p_read : !p)
  hir.copy ins(%p_read : !p) outs(%copy : !p)
  %w4 = hir.reduce_scatter %p_read into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %w4
  %p_if = hir.allocate(%m, %n) symmetric : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%p_if : !p)
  %w5 = hir.reduce_scatter %p_if into %y team [0, 1] op sum backend cuda : !p, !y
  scf.if %c {
    hir.wait %w5
  }
  %pm = hir.allocate(%m, %n) symmetric : !pm
  hir.matmul ins(%xm, %w3 : !xm, !w3) outs(%pm : !pm)
  %w6 = hir.reduce_scatter %pm into %ym team [0, 1] op sum backend cuda : !pm, !ym
  hir.wait %w6
  %c0 = arith.constant 0 : index
  %chunks = hir.allocate(%m, %n) symmetric : !fusion.tensor<[3, 2, 2, ?, ?], bf16, mesh = [0, 1], axes = [_, didx, _, _, _]>
  %chunk = hir.alias_select %chunks[0 = %c0] : !fusion.tensor<[3, 2, 2, ?, ?], bf16, mesh = [0, 1], axes = [_, didx, _, _, _]> -> !p
  hir.matmul ins(%x, %w : !x, !w) outs(%chunk : !p)
  %w7 = hir.reduce_scatter %chunk into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %w7
  %again = hir.alias_select %chunks[0 = %c0] : !fusion.tensor<[3, 2, 2, ?, ?], bf16, mesh = [0, 1], axes = [_, didx, _, _, _]> -> !p
  hir.copy ins(%again : !p) outs(%copy2 : !p)
  %xb = hir.allocate(%m, %k) : !x
  hir.copy ins(%x : !x) outs(%xb : !x)
  %p_w = hir.allocate(%m, %n) symmetric : !p
  hir.matmul ins(%xb, %w : !x, !w) outs(%p_w : !p)
  hir.pointwise "relu" ins(%xb : !x) outs(%xb : !x)
  %w8 = hir.reduce_scatter %p_w into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %w8
  func.return
}

// CHECK-LABEL: func.func @left_alone(
// CHECK-NOT:     accumulate
// CHECK-NOT:     hir.send
// CHECK-COUNT-8: hir.reduce_scatter
// CHECK-NOT:     accumulate

// -----

// Left alone too: a matmul that writes the product after the reduce-scatter (after its
// wait, or before it), or in another block, or into the buffer the reduce-scatter's input is a view of, or adds into it; a
// scattered axis that is the matmul's M, not a batch axis; and one that is an operand's
// didx axis.

!x = !fusion.tensor<[2, 2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _, _]>
!w = !fusion.tensor<[?, ?], bf16, mesh = [0, 1]>
!p = !fusion.tensor<[2, 2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _, _]>
!y = !fusion.tensor<[2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _]>
!chunks = !fusion.tensor<[3, 2, 2, ?, ?], bf16, mesh = [0, 1], axes = [_, didx, _, _, _]>
!xc = !fusion.tensor<[3, 2, 2, ?, ?], bf16, mesh = [0, 1]>
!xm = !fusion.tensor<[2, 2, ?], bf16, mesh = [0, 1], axes = [didx, _, _]>
!pm = !fusion.tensor<[2, 2, ?], bf16, mesh = [0, 1], axes = [didx, _, _]>
!ym = !fusion.tensor<[2, ?], bf16, mesh = [0, 1], axes = [didx, _]>
!wd = !fusion.tensor<[2, 2, ?, ?], bf16, mesh = [0, 1], axes = [_, didx, _, _]>

func.func @left_alone_too(%x: !x, %w: !w, %y: !y, %c: i1, %xc: !xc, %xm: !xm, %ym: !ym, %wd: !wd) {
  %c0 = arith.constant 0 : index
  %m = hir.dim %x, 2 : !x
  %n = hir.dim %w, 1 : !w
  %late = hir.allocate(%m, %n) symmetric : !p
  %w1 = hir.reduce_scatter %late into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %w1
  hir.matmul ins(%x, %w : !x, !w) outs(%late : !p)
  %early_wait = hir.allocate(%m, %n) symmetric : !p
  %w0 = hir.reduce_scatter %early_wait into %y team [0, 1] op sum backend cuda : !p, !y
  hir.matmul ins(%x, %w : !x, !w) outs(%early_wait : !p)
  hir.wait %w0
  %nested = hir.allocate(%m, %n) symmetric : !p
  scf.if %c {
    hir.matmul ins(%x, %w : !x, !w) outs(%nested : !p)
  }
  %w2 = hir.reduce_scatter %nested into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %w2
  %chunks = hir.allocate(%m, %n) symmetric : !chunks
  hir.matmul ins(%xc, %w : !xc, !w) outs(%chunks : !chunks)
  %chunk = hir.alias_select %chunks[0 = %c0] : !chunks -> !p
  %w3 = hir.reduce_scatter %chunk into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %w3
  %rows = hir.allocate(%n) symmetric : !pm
  hir.matmul ins(%xm, %w : !xm, !w) outs(%rows : !pm)
  %w4 = hir.reduce_scatter %rows into %ym team [0, 1] op sum backend cuda : !pm, !ym
  hir.wait %w4
  %sharded = hir.allocate(%m, %n) symmetric : !p
  hir.matmul ins(%x, %wd : !x, !wd) outs(%sharded : !p)
  %w5 = hir.reduce_scatter %sharded into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %w5
  %added = hir.allocate(%m, %n) symmetric : !p
  hir.matmul accumulate ins(%x, %w : !x, !w) outs(%added : !p)
  %w6 = hir.reduce_scatter %added into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %w6
  func.return
}

// CHECK-LABEL: func.func @left_alone_too(
// CHECK-NOT:     hir.send
// CHECK-COUNT-6: hir.reduce_scatter
// CHECK:         hir.matmul accumulate
// CHECK-NEXT:    hir.reduce_scatter
// CHECK-NOT:     hir.send

// -----

// The input gradient of two projections, dx = dq @ wq + dk @ wk: the peer's rows are dq's
// slice times wq with dk's slice times wk added in, the own rows both added into the
// output after the wait; the products, their sum, the add kernel and its segment are gone.
// A sum whose product is read by something else is left as it is.

!d = !fusion.tensor<[2, 2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!w = !fusion.tensor<[2, 1, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!p = !fusion.tensor<[2, 2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!y = !fusion.tensor<[2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _]>

func.func private @add(%a: !p, %b: !p) -> !p {
  %sum = fusion.add %a, %b : (!p, !p) -> !p
  func.return %sum : !p
}

func.func @two_projections(%dq: !d, %wq: !w, %dk: !d, %wk: !w, %y: !y, %z: !y) -> !p {
  %m = hir.dim %dq, 2 : !d
  %n = hir.dim %wq, 3 : !w
  %q = hir.allocate(%m, %n) : !p
  hir.matmul ins(%dq, %wq : !d, !w) outs(%q : !p)
  %k = hir.allocate(%m, %n) : !p
  hir.matmul ins(%dk, %wk : !d, !w) outs(%k : !p)
  %partial = hir.allocate(%m, %n) symmetric : !p
  hir.launch_kernel @add ins(%q, %k : !p, !p) outs(%partial : !p)
  %work = hir.reduce_scatter %partial into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %work
  %kept = hir.allocate(%m, %n) : !p
  hir.matmul ins(%dq, %wq : !d, !w) outs(%kept : !p)
  %other = hir.allocate(%m, %n) : !p
  hir.matmul ins(%dk, %wk : !d, !w) outs(%other : !p)
  %summed = hir.allocate(%m, %n) symmetric : !p
  hir.launch_kernel @add ins(%kept, %other : !p, !p) outs(%summed : !p)
  %kept_work = hir.reduce_scatter %summed into %z team [0, 1] op sum backend cuda : !p, !y
  hir.wait %kept_work
  func.return %kept : !p
}

// CHECK-LABEL: func.func @two_projections(
// CHECK:         %[[PARTIAL:[^ ]+]] = hir.allocate({{.*}}) symmetric
// CHECK-NEXT:    %[[DQ:[^ ]+]] = hir.alias_select %dq[1 = %[[PEER:[^ ]+]]]
// CHECK-NEXT:    %[[WQ:[^ ]+]] = hir.alias_select %wq[1 = %[[C0:[^ ]+]]]
// CHECK-NEXT:    %[[DK:[^ ]+]] = hir.alias_select %dk[1 = %[[PEER]]]
// CHECK-NEXT:    %[[WK:[^ ]+]] = hir.alias_select %wk[1 = %[[C0]]]
// CHECK-NEXT:    %[[TO_PEER:[^ ]+]] = hir.alias_select %[[PARTIAL]][1 = %[[C0]]]
// CHECK-NEXT:    hir.matmul ins(%[[DQ]], %[[WQ]] : {{.*}}) outs(%[[TO_PEER]] :
// CHECK-NEXT:    hir.matmul accumulate ins(%[[DK]], %[[WK]] : {{.*}}) outs(%[[TO_PEER]] :
// CHECK-NEXT:    hir.start_coalescing
// CHECK:         hir.wait
// CHECK-NEXT:    %[[DQ_OWN:[^ ]+]] = hir.alias_select %dq[1 = %[[OWN:[^ ]+]]]
// CHECK-NEXT:    %[[DK_OWN:[^ ]+]] = hir.alias_select %dk[1 = %[[OWN]]]
// CHECK-NEXT:    hir.matmul accumulate ins(%[[DQ_OWN]], %[[WQ]] : {{.*}}) outs(%y :
// CHECK-NEXT:    hir.matmul accumulate ins(%[[DK_OWN]], %[[WK]] : {{.*}}) outs(%y :
// CHECK-NEXT:    %kept = hir.allocate
// CHECK:         hir.launch_kernel @add ins(%kept, %other
// CHECK-NEXT:    hir.reduce_scatter %summed
