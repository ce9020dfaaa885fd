// RUN: hir-opt %s -p stream-parallel | filecheck %s
// RUN: hir-opt %s -p stream-parallel > %t && hir-opt %s -p stream-parallel,stream-parallel | diff %t -

// A stream-parallel kernel launch runs a sliced copy of its segment: every value
// loses the axis that feeds the stream axis, and a broadcast that only inserted
// that axis becomes a plain set. The original segment goes once nothing calls it.
// (nvFuser refuses stream-parallel kernels.)

!s = !fusion.tensor<[?, ?], f32, axes = [stream, _]>
!v = !fusion.tensor<[?], f32>

func.func private @kernel(%x: !s, %y: !v) -> !s {
  %b = fusion.broadcast %y [0] : !v -> !fusion.tensor<[1, ?], f32>
  %s = fusion.add %x, %b : (!s, !fusion.tensor<[1, ?], f32>) -> !s
  %e = fusion.exp %s : !s -> !s
  func.return %e : !s
}

// CHECK-NOT:   func.func private @kernel(
// CHECK-LABEL: func.func private @kernel_slice(
// CHECK-SAME:      %[[X:[^:]+]]: !fusion.tensor<[?], f32>, %[[Y:[^:]+]]: !fusion.tensor<[?], f32>) -> !fusion.tensor<[?], f32> {
// CHECK-NEXT:    %[[B:[^ ]+]] = fusion.set %[[Y]] : !fusion.tensor<[?], f32> -> !fusion.tensor<[?], f32>
// CHECK-NEXT:    %[[S:[^ ]+]] = fusion.add %[[X]], %[[B]] : (!fusion.tensor<[?], f32>, !fusion.tensor<[?], f32>) -> !fusion.tensor<[?], f32>
// CHECK-NEXT:    %[[E:[^ ]+]] = fusion.exp %[[S]] : !fusion.tensor<[?], f32> -> !fusion.tensor<[?], f32>
// CHECK-NEXT:    func.return %[[E]] : !fusion.tensor<[?], f32>
// CHECK-NEXT:  }
// CHECK-NOT:   func.func private @kernel(

func.func @launch(%x: !s, %y: !v) -> (!s, !s) {
  %d0 = hir.dim %x, 0 : !s
  %d1 = hir.dim %x, 1 : !s
  %o = hir.allocate(%d0, %d1) : !s
  hir.launch_kernel @kernel ins(%x, %y : !s, !v) outs(%o : !s)
  %p = hir.allocate(%d0, %d1) : !s
  hir.launch_kernel @kernel ins(%o, %y : !s, !v) outs(%p : !s)
  func.return %o, %p : !s, !s
}

// Both launches run in one loop, on the same sliced segment; %y has no stream
// axis and goes whole.

// CHECK-LABEL: func.func @launch(
// CHECK-SAME:      %[[X:[^:]+]]: !fusion.tensor<[?, ?], f32, axes = [stream, _]>, %[[Y:[^:]+]]: !fusion.tensor<[?], f32>)
// CHECK:         %[[O:[^ ]+]] = hir.allocate
// CHECK:         %[[P:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[X_I:[^ ]+]] = hir.alias_select %[[X]][0 = %[[I]]]
// CHECK-NEXT:      %[[O_I:[^ ]+]] = hir.alias_select %[[O]][0 = %[[I]]]
// CHECK-NEXT:      hir.launch_kernel @kernel_slice ins(%[[X_I]], %[[Y]] : !fusion.tensor<[?], f32>, !fusion.tensor<[?], f32>) outs(%[[O_I]] : !fusion.tensor<[?], f32>)
// CHECK-NEXT:      %[[P_I:[^ ]+]] = hir.alias_select %[[P]][0 = %[[I]]]
// CHECK-NEXT:      hir.launch_kernel @kernel_slice ins(%[[O_I]], %[[Y]] : {{.*}}) outs(%[[P_I]] :
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NOT:     scf.for

// A data-movement segment (post_on_stream) whose broadcast keeps a new axis: the
// stream axis of the result comes from the input, so the new axes are renumbered.
// The segment stays as well, for the launch that is not stream-parallel.

!in = !fusion.tensor<[?, ?], f32>
!bc = !fusion.tensor<[?, 1, ?], f32, axes = [_, _, stream]>

func.func private @expand(%a: !in) -> !bc {
  %r = fusion.broadcast %a [1] : !in -> !bc
  func.return %r : !bc
}

// CHECK-LABEL: func.func private @expand(
// CHECK-LABEL: func.func private @expand_slice(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?], f32>) -> !fusion.tensor<[?, 1], f32> {
// CHECK-NEXT:    fusion.broadcast %[[A]] [1] : !fusion.tensor<[?], f32> -> !fusion.tensor<[?, 1], f32>

!nb = !fusion.tensor<[?, 1, ?], f32>

func.func @post(%a: !in) -> (!bc, !nb) {
  %d0 = hir.dim %a, 0 : !in
  %d1 = hir.dim %a, 1 : !in
  %r = hir.allocate(%d0, %d1) : !bc
  hir.post_on_stream @expand ins(%a : !in) outs(%r : !bc)
  %whole = hir.allocate(%d0, %d1) : !nb
  hir.post_on_stream @expand ins(%a : !in) outs(%whole : !nb)
  func.return %r, %whole : !bc, !nb
}

// CHECK-LABEL: func.func @post(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[R:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[A_I:[^ ]+]] = hir.alias_select %[[A]][1 = %[[I]]]
// CHECK-NEXT:      %[[R_I:[^ ]+]] = hir.alias_select %[[R]][2 = %[[I]]]
// CHECK-NEXT:      hir.post_on_stream @expand_slice ins(%[[A_I]] : !fusion.tensor<[?], f32>) outs(%[[R_I]] : !fusion.tensor<[?, 1], f32>)
// CHECK:         }
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.post_on_stream @expand ins(%[[A]] : !fusion.tensor<[?, ?], f32>) outs(%[[W]] :
