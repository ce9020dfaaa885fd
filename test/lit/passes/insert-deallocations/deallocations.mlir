// RUN: hir-opt %s -p insert-deallocations | filecheck %s
// RUN: hir-opt %s -p insert-deallocations > %t && hir-opt %s -p insert-deallocations,insert-deallocations | diff %t -

!t = !fusion.tensor<[?, ?], f32>
!v = !fusion.tensor<[?], f32>

// An intermediate buffer is freed right after its last use; the returned one is not.

func.func @chain(%a: !t) -> !t {
  %d0 = hir.dim %a, 0 : !t
  %d1 = hir.dim %a, 1 : !t
  %x = hir.allocate(%d0, %d1) : !t
  hir.pointwise "neg" ins(%a : !t) outs(%x : !t)
  %y = hir.allocate(%d0, %d1) : !t
  hir.pointwise "exp" ins(%x : !t) outs(%y : !t)
  %z = hir.allocate(%d0, %d1) : !t
  hir.pointwise "add" ins(%x, %y : !t, !t) outs(%z : !t)
  %w = hir.allocate(%d0, %d1) : !t
  hir.pointwise "relu" ins(%z : !t) outs(%w : !t)
  func.return %w : !t
}

// CHECK-LABEL: func.func @chain(
// CHECK:         %[[X:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.pointwise "neg"
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.pointwise "exp"
// CHECK-NEXT:    %[[Z:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.pointwise "add" ins(%[[X]], %[[Y]] : {{.*}}) outs(%[[Z]] :
// CHECK-DAG:     hir.deallocate %[[X]]
// CHECK-DAG:     hir.deallocate %[[Y]]
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.pointwise "relu" ins(%[[Z]] : {{.*}}) outs(%[[W]] :
// CHECK-NEXT:    hir.deallocate %[[Z]]
// CHECK-NEXT:    func.return %[[W]]
// CHECK-NOT:     hir.deallocate %[[W]]

// Uses inside a loop or a branch, direct or through views, count as uses by the
// loop or the branch: the buffer is freed after it, in the allocation's block.
// A buffer returned through a view is not freed.

func.func @nested(%a: !t, %flag: i1) -> !v {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = hir.dim %a, 0 : !t
  %d1 = hir.dim %a, 1 : !t
  %x = hir.allocate(%d0, %d1) : !t
  %y = hir.allocate(%d0, %d1) : !t
  %r = hir.allocate(%d0, %d1) : !t
  scf.for %i = %c0 to %d0 step %c1 {
    %xi = hir.alias_select %x[0 = %i] : !t -> !v
    %ai = hir.alias_select %a[0 = %i] : !t -> !v
    hir.pointwise "neg" ins(%ai : !v) outs(%xi : !v)
    scf.if %flag {
      %yi = hir.alias_select %y[0 = %i] : !t -> !v
      hir.copy ins(%xi : !v) outs(%yi : !v)
    }
  }
  hir.copy ins(%y : !t) outs(%r : !t)
  %r0 = hir.alias_select %r[0 = %c0] : !t -> !v
  func.return %r0 : !v
}

// CHECK-LABEL: func.func @nested(
// CHECK:         %[[X:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[R:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for
// CHECK-NOT:       hir.deallocate
// CHECK:             hir.copy
// CHECK-NEXT:      }
// CHECK-NEXT:    }
// CHECK-NEXT:    hir.deallocate %[[X]]
// CHECK-NEXT:    hir.copy ins(%[[Y]] : {{.*}}) outs(%[[R]] :
// CHECK-NEXT:    hir.deallocate %[[Y]]
// CHECK-NEXT:    hir.alias_select %[[R]]
// CHECK-NEXT:    func.return
// CHECK-NOT:     hir.deallocate

// A buffer nothing uses is freed right away; one already freed is left alone.

func.func @unused_and_freed(%a: !t) {
  %d0 = hir.dim %a, 0 : !t
  %x = hir.allocate(%d0) : !fusion.tensor<[?, 4], f32>
  %y = hir.allocate(%d0) : !fusion.tensor<[?, 4], f32>
  hir.deallocate %y : !fusion.tensor<[?, 4], f32>
  func.return
}

// CHECK-LABEL: func.func @unused_and_freed(
// CHECK:         %[[X:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.deallocate %[[X]]
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.deallocate %[[Y]]
// CHECK-NEXT:    func.return

// A communication uses its buffers until its wait; a coalesced send or receive until
// the wait of its batch.

!c = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
!g = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3]>

func.func @communications(%in: !c, %peer: index) -> (!g, !c) {
  %m = hir.dim %in, 1 : !c
  %x = hir.allocate(%m) : !c
  hir.copy ins(%in : !c) outs(%x : !c)
  %g = hir.allocate(%m) : !g
  %w = hir.allgather %x into %g team [0, 1, 2, 3] backend nccl : !c, !g
  %o = hir.allocate(%m) : !c
  hir.copy ins(%in : !c) outs(%o : !c)
  hir.wait %w
  %y = hir.allocate(%m) : !c
  %r = hir.allocate(%m) : !c
  hir.copy ins(%in : !c) outs(%y : !c)
  hir.start_coalescing
  %s = hir.send %y to %peer backend nccl : !c
  %v = hir.recv %r from %peer backend nccl : !c
  %e = hir.end_coalescing
  hir.copy ins(%in : !c) outs(%o : !c)
  hir.wait %e
  func.return %g, %o : !g, !c
}

// CHECK-LABEL: func.func @communications(
// CHECK:         %[[X:[^ ]+]] = hir.allocate
// CHECK:         %[[W:[^ ]+]] = hir.allgather %[[X]]
// CHECK-NEXT:    hir.allocate
// CHECK-NEXT:    hir.copy
// CHECK-NEXT:    hir.wait %[[W]]
// CHECK-NEXT:    hir.deallocate %[[X]]
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[R:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.copy
// CHECK-NEXT:    hir.start_coalescing
// CHECK-NEXT:    hir.send %[[Y]]
// CHECK-NEXT:    hir.recv %[[R]]
// CHECK-NEXT:    %[[E:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:    hir.copy
// CHECK-NEXT:    hir.wait %[[E]]
// CHECK-DAG:     hir.deallocate %[[Y]]
// CHECK-DAG:     hir.deallocate %[[R]]
// CHECK-NEXT:    func.return

// A transfer whose work an scf.for carries to a later iteration or past the loop
// (copy-engine-pipelining) uses its buffer until the wait that ends it: the buffer the
// peers read is freed after the last wait, not after the loop.

!s = !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>
!o = !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [stream, _]>
!r = !fusion.tensor<[?], f32, mesh = [0, 1]>

func.func @carried_work(%x: !s) -> !o {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %n = hir.dim %x, 1 : !s
  %shards = hir.allocate(%n) symmetric : !s
  hir.copy ins(%x : !s) outs(%shards : !s)
  %y = hir.allocate(%n) : !o
  %peer = hir.alias_select %y[0 = %c1] : !o -> !r
  hir.start_coalescing
  %r = hir.recv %peer from %c1 backend cuda : !r
  %s = hir.send %shards to %c1 backend cuda : !s
  %first = hir.end_coalescing
  %last = scf.for %i = %c2 to %c2 step %c1 iter_args(%previous = %first) -> (!hir.work) {
    hir.wait %previous
    scf.yield %previous : !hir.work
  }
  hir.wait %last
  func.return %y : !o
}

// CHECK-LABEL: func.func @carried_work(
// CHECK:         %[[SHARDS:[^ ]+]] = hir.allocate(%{{.*}}) symmetric
// CHECK:         scf.for
// CHECK:         }
// CHECK-NEXT:    hir.wait
// CHECK-NEXT:    hir.deallocate %[[SHARDS]]
// CHECK-NEXT:    func.return

// A buffer the caller's stream allocated and a pool stream used is freed only once the
// caller's stream has waited for that stream: after its next hir.synchronize_stream, not
// after its last use (the pool stream may still read it). One the pool stream allocated
// itself is freed after its last use, as any other.

func.func @pool_stream(%a: !t) -> !t {
  %c0 = arith.constant 0 : index
  %main = hir.get_current_stream
  %d0 = hir.dim %a, 0 : !t
  %d1 = hir.dim %a, 1 : !t
  %x = hir.allocate(%d0, %d1) : !t
  hir.pointwise "neg" ins(%a : !t) outs(%x : !t)
  %s = hir.stream %c0
  hir.set_current_stream %s
  hir.synchronize_stream %main
  %y = hir.allocate(%d0, %d1) : !t
  hir.pointwise "exp" ins(%x : !t) outs(%y : !t)
  %z = hir.allocate(%d0, %d1) : !t
  hir.pointwise "exp" ins(%y : !t) outs(%z : !t)
  hir.set_current_stream %main
  %w = hir.allocate(%d0, %d1) : !t
  hir.pointwise "relu" ins(%a : !t) outs(%w : !t)
  hir.synchronize_stream %s
  hir.pointwise "add" ins(%w, %z : !t, !t) outs(%w : !t)
  func.return %w : !t
}

// CHECK-LABEL: func.func @pool_stream(
// CHECK:         hir.pointwise "exp" ins(%[[X:[^ ]+]] :
// CHECK-SAME:      outs(%[[Y:[^ ]+]] :
// CHECK-NEXT:    %[[Z:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.pointwise "exp" ins(%[[Y]] : {{.*}}) outs(%[[Z]] :
// CHECK-NEXT:    hir.deallocate %[[Y]]
// CHECK-NEXT:    hir.set_current_stream
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.pointwise "relu"
// CHECK-NEXT:    hir.synchronize_stream
// CHECK-NEXT:    hir.deallocate %[[X]]
// CHECK-NEXT:    hir.pointwise "add"
