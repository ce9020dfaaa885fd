// RUN: hir-opt %s -p cat-to-rotate-half | filecheck %s
// RUN: hir-opt %s -p cat-to-rotate-half > %t && hir-opt %t -p cat-to-rotate-half | diff %t -

// cat-to-rotate-half: the rotation of a rotary embedding, a `cat` of the halves of the last
// axis swapped with one negated, becomes `fusion.rotate_half` (or its negation, the
// backward's), and the halves and the negation go where nothing else reads them.

!x = !fusion.tensor<[2, 4, 8], bf16, mesh = [0, 1], axes = [didx, _, _]>
!h = !fusion.tensor<[2, 4, 4], bf16, mesh = [0, 1], axes = [didx, _, _]>

// The forward: Llama's rotate_half, its halves cut by split (on the local piece of a
// varying tensor, whose last axis is 1).
// CHECK-LABEL: func.func @forward(
// CHECK-NEXT:    %r = fusion.rotate_half %x : !fusion.tensor<[2, 4, 8], bf16, {{.*}}> -> !fusion.tensor<[2, 4, 8], bf16, {{.*}}>
// CHECK-NEXT:    func.return %r
func.func @forward(%x: !x) -> !x {
  %lo, %hi = fusion.aten "aten.split.Tensor"(%x, 4, -1) : (!x) -> (!h, !h)
  %n = fusion.neg %hi : !h -> !h
  %r = fusion.aten "aten.cat.default"([%n, %lo], -1) : (!h, !h) -> !x
  func.return %r : !x
}

// The backward's transpose, its halves cut by slice: the negated rotation. The first half
// is read again, so its slice stays.
// CHECK-LABEL: func.func @backward(
// CHECK-NEXT:    %lo = fusion.aten "aten.slice.Tensor"(%g, 1, 0, 4)
// CHECK-NEXT:    %r = fusion.rotate_half %g
// CHECK-NEXT:    %r_1 = fusion.neg %r
// CHECK-NEXT:    func.return %r_1, %lo
func.func @backward(%g: !x) -> (!x, !h) {
  %lo = fusion.aten "aten.slice.Tensor"(%g, 1, 0, 4) : (!x) -> !h
  %hi = fusion.aten "aten.slice.Tensor"(%g, 1, 4, 9223372036854775807) : (!x) -> !h
  %n = fusion.neg %lo : !h -> !h
  %r = fusion.aten "aten.cat.default"([%hi, %n], 1) : (!h, !h) -> !x
  func.return %r, %lo : !x, !h
}

// Not rotations: the halves in their own order, halves of two tensors, a cat along another
// axis, a split along another axis.
// CHECK-LABEL: func.func @not_rotations(
// CHECK-NOT:     fusion.rotate_half
// CHECK:         func.return
!s = !fusion.tensor<[8, 8], f32>
!t = !fusion.tensor<[8, 4], f32>
!u = !fusion.tensor<[4, 8], f32>
func.func @not_rotations(%x: !s, %y: !s) -> (!s, !s, !fusion.tensor<[16, 4], f32>, !s) {
  %lo, %hi = fusion.aten "aten.split.Tensor"(%x, 4, -1) : (!s) -> (!t, !t)
  %n = fusion.neg %lo : !t -> !t
  %same_order = fusion.aten "aten.cat.default"([%n, %hi], -1) : (!t, !t) -> !s
  %ylo, %yhi = fusion.aten "aten.split.Tensor"(%y, 4, -1) : (!s) -> (!t, !t)
  %m = fusion.neg %yhi : !t -> !t
  %two_tensors = fusion.aten "aten.cat.default"([%m, %lo], -1) : (!t, !t) -> !s
  %other_axis = fusion.aten "aten.cat.default"([%m, %lo], 0) : (!t, !t) -> !fusion.tensor<[16, 4], f32>
  %top, %bottom = fusion.aten "aten.split.Tensor"(%x, 4) : (!s) -> (!u, !u)
  %k = fusion.neg %bottom : !u -> !u
  %rows = fusion.aten "aten.cat.default"([%k, %top]) : (!u, !u) -> !s
  func.return %same_order, %two_tensors, %other_axis, %rows : !s, !s, !fusion.tensor<[16, 4], f32>, !s
}

// A rotation of a cast: the cast of the rotation, which reads the bf16 values from memory
// (the complex pairs of rotary embeddings, read in f32). The cast stays for its other reader.
// CHECK-LABEL: func.func @rotation_of_a_cast(
// CHECK-NEXT:    %wide = fusion.cast %x : !fusion.tensor<[2, 4, 8], bf16, {{.*}}> -> !fusion.tensor<[2, 4, 8], f32, {{.*}}>
// CHECK-NEXT:    %r = fusion.rotate_half %x : !fusion.tensor<[2, 4, 8], bf16, {{.*}}> -> !fusion.tensor<[2, 4, 8], bf16, {{.*}}>
// CHECK-NEXT:    %r_1 = fusion.cast %r : !fusion.tensor<[2, 4, 8], bf16, {{.*}}> -> !fusion.tensor<[2, 4, 8], f32, {{.*}}>
// CHECK-NEXT:    func.return %r_1, %wide
// CHECK-LABEL: func.func @rotation_of_a_cast_read_once(
// CHECK-NEXT:    %r = fusion.rotate_half %x
// CHECK-NEXT:    %r_1 = fusion.cast %r
// CHECK-NEXT:    func.return %r_1
!w = !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>
!wh = !fusion.tensor<[2, 4, 4], f32, mesh = [0, 1], axes = [didx, _, _]>
func.func @rotation_of_a_cast(%x: !x) -> (!w, !w) {
  %wide = fusion.cast %x : !x -> !w
  %lo, %hi = fusion.aten "aten.split.Tensor"(%wide, 4, -1) : (!w) -> (!wh, !wh)
  %n = fusion.neg %hi : !wh -> !wh
  %r = fusion.aten "aten.cat.default"([%n, %lo], -1) : (!wh, !wh) -> !w
  func.return %r, %wide : !w, !w
}
func.func @rotation_of_a_cast_read_once(%x: !x) -> !w {
  %wide = fusion.cast %x : !x -> !w
  %lo, %hi = fusion.aten "aten.split.Tensor"(%wide, 4, -1) : (!w) -> (!wh, !wh)
  %n = fusion.neg %hi : !wh -> !wh
  %r = fusion.aten "aten.cat.default"([%n, %lo], -1) : (!wh, !wh) -> !w
  func.return %r : !w
}
