// RUN: hir-opt %s --split-input-file -p insert-reshardings | filecheck %s
// RUN: hir-opt %s --split-input-file -p insert-reshardings > %t && hir-opt %s --split-input-file -p insert-reshardings,insert-reshardings | diff %t -

// pr3736: the input of the stream-parallel linear is gathered by a set into the
// layout the linear computes in, stream axis included (nvFuser's AG+GEMM overlap).

!in = !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>
!w = !fusion.tensor<[?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
!b = !fusion.tensor<[?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
!out = !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _, _]>

func.func @ag_linear(%in: !in, %w: !w, %b: !b) -> !out {
  %out = fusion.linear %in, %w, %b : (!in, !w, !b) -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @ag_linear(
// CHECK-NEXT:    %[[G:[^ ]+]] = fusion.set %in : !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]> -> !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _, _]>
// CHECK-NEXT:    %[[OUT:[^ ]+]] = fusion.linear %[[G]], %w, %b
// CHECK-NEXT:    func.return %[[OUT]]

// -----

// AG_matmul at mesh size 3: only A moves; B is already where the matmul needs it.

!a = !fusion.tensor<[?, 3, ?, ?], f32, mesh = [0, 1, 2], axes = [_, didx, _, _]>
!bm = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2]>
!c = !fusion.tensor<[?, 3, ?, ?], f32, mesh = [0, 1, 2], axes = [stream, _, _, _]>

func.func @ag_matmul(%a: !a, %b: !bm) -> !c {
  %c = fusion.matmul %a, %b : (!a, !bm) -> !c
  func.return %c : !c
}

// CHECK-LABEL: func.func @ag_matmul(
// CHECK-NEXT:    %[[G:[^ ]+]] = fusion.set %a : {{.*}} -> !fusion.tensor<[?, 3, ?, ?], f32, mesh = [0, 1, 2], axes = [stream, _, _, _]>
// CHECK-NEXT:    %[[C:[^ ]+]] = fusion.matmul %[[G]], %b
// CHECK-NEXT:    func.return %[[C]]

// -----

// matmul_AR: the matmul is local (both operands are sharded along the batch axis it
// keeps sharded), and the sum over that axis is itself the allreduce.

!a = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>
!b = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
!p = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, didx, _, _]>
!o = !fusion.tensor<[?, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>

func.func @matmul_ar(%a: !a, %b: !b) -> !o {
  %p = fusion.matmul %a, %b : (!a, !b) -> !p
  %o = fusion.sum %p [1] : !p -> !o
  func.return %o : !o
}

// CHECK-LABEL: func.func @matmul_ar(
// CHECK-NOT:     fusion.set
// CHECK:         fusion.matmul
// CHECK-NEXT:    fusion.sum
// CHECK-NEXT:    func.return

// -----

// A replicated operand that broadcasts along the sharded axis needs no movement; a
// replicated operand that has that axis is sliced to the sharded layout by a set.

!x = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
!row = !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3]>
!full = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3]>

func.func @operands(%x: !x, %row: !row, %full: !full) -> !x {
  %y = fusion.add %x, %row : (!x, !row) -> !x
  %z = fusion.mul %y, %full : (!x, !full) -> !x
  func.return %z : !x
}

// CHECK-LABEL: func.func @operands(
// CHECK-NEXT:    %[[Y:[^ ]+]] = fusion.add %x, %row
// CHECK-NEXT:    %[[S:[^ ]+]] = fusion.set %full : !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3]> -> !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
// CHECK-NEXT:    %[[Z:[^ ]+]] = fusion.mul %[[Y]], %[[S]]

// -----

// An op whose result lives on another mesh reads its operand through a set onto that
// mesh; one set serves both uses of a value.

!x = !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>
!y = !fusion.tensor<[2, ?], f32, mesh = [2, 3], axes = [didx, _]>

func.func @moved(%x: !x) -> !y {
  %y = fusion.mul %x, %x : (!x, !x) -> !y
  func.return %y : !y
}

// CHECK-LABEL: func.func @moved(
// CHECK-NEXT:    %[[S:[^ ]+]] = fusion.set %x : !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2, ?], f32, mesh = [2, 3], axes = [didx, _]>
// CHECK-NEXT:    %y = fusion.mul %[[S]], %[[S]]
// CHECK-NOT:     fusion.set

// -----

// A sum over a serial axis of a sharded input whose result is replicated gathers the
// input first; a sum over the didx axis and another is split so that the
// communication reduces the didx axis alone.

!x = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
!r = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3]>
!t = !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3]>

func.func @reductions(%x: !x) -> (!r, !t) {
  %r = fusion.sum %x [2] : !x -> !r
  %t = fusion.max %x [0, 2] : !x -> !t
  func.return %r, %t : !r, !t
}

// CHECK-LABEL: func.func @reductions(
// CHECK-NEXT:    %[[G:[^ ]+]] = fusion.set %x : {{.*}} -> !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3]>
// CHECK-NEXT:    %[[R:[^ ]+]] = fusion.sum %[[G]] [2]
// CHECK-NEXT:    %[[P:[^ ]+]] = fusion.max %x [2] : {{.*}} -> !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
// CHECK-NEXT:    %[[T:[^ ]+]] = fusion.max %[[P]] [0] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3]>
// CHECK-NEXT:    func.return %[[R]], %[[T]]
