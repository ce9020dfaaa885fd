// RUN: hir-opt %s --split-input-file -p copy-engine-pipelining | filecheck %s

// A stream loop whose transfer is a batch of copy-engine sends and recvs, as
// reduce-scatter-in-matmul makes it, is software-pipelined; a batch with anything but
// sends and recvs between its start and its end, or with a send outside it, is not.

!b = !fusion.tensor<[?, 4], f32, mesh = [0, 1], axes = [stream, _]>
!row = !fusion.tensor<[4], f32, mesh = [0, 1]>

func.func @batch(%b: !b, %out: !b, %peer: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %main_stream = hir.get_current_stream
  %num_streams = hir.number_of_streams
  %n = hir.dim %b, 0 : !b
  scf.for %i = %c0 to %n step %c1 {
    %stream_index = arith.remui %i, %num_streams : index
    %stream = hir.stream %stream_index
    hir.set_current_stream %stream
    %row = hir.alias_select %b[0 = %i] : !b -> !row
    %out_row = hir.alias_select %out[0 = %i] : !b -> !row
    hir.start_coalescing
    %sent = hir.send %row to %peer backend cuda : !row
    %received = hir.recv %out_row from %peer backend cuda : !row
    %work = hir.end_coalescing
    hir.wait %work
    hir.pointwise "relu" ins(%out_row : !row) outs(%out_row : !row)
    hir.set_current_stream %main_stream
    hir.synchronize_stream %stream
  }
  func.return
}

// CHECK-LABEL: func.func @batch(
// CHECK-NOT:     hir.set_current_stream
// CHECK:         scf.if
// CHECK:           hir.end_coalescing
// CHECK:           scf.for {{.*}} iter_args
// CHECK:             hir.end_coalescing
// CHECK:             hir.wait
// CHECK-NEXT:        hir.pointwise "relu"

// -----

!b = !fusion.tensor<[?, 4], f32, mesh = [0, 1], axes = [stream, _]>
!row = !fusion.tensor<[4], f32, mesh = [0, 1]>

func.func @copy_in_the_batch(%b: !b, %out: !b, %peer: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %main_stream = hir.get_current_stream
  %num_streams = hir.number_of_streams
  %n = hir.dim %b, 0 : !b
  scf.for %i = %c0 to %n step %c1 {
    %stream_index = arith.remui %i, %num_streams : index
    %stream = hir.stream %stream_index
    hir.set_current_stream %stream
    %row = hir.alias_select %b[0 = %i] : !b -> !row
    %out_row = hir.alias_select %out[0 = %i] : !b -> !row
    hir.start_coalescing
    hir.copy ins(%row : !row) outs(%out_row : !row)
    %work = hir.end_coalescing
    %sent = hir.send %row to %peer backend cuda : !row
    hir.wait %work
    hir.set_current_stream %main_stream
    hir.synchronize_stream %stream
  }
  func.return
}

// CHECK-LABEL: func.func @copy_in_the_batch(
// CHECK:         scf.for
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NOT:     scf.if

// -----

// A loop that does not start at 0 is left alone: the pipelined form issues iteration 0 first.

!b = !fusion.tensor<[?, 4], f32, mesh = [0, 1], axes = [stream, _]>
!row = !fusion.tensor<[4], f32, mesh = [0, 1]>

func.func @from_one(%b: !b, %out: !b, %peer: index) {
  %c1 = arith.constant 1 : index
  %main_stream = hir.get_current_stream
  %num_streams = hir.number_of_streams
  %n = hir.dim %b, 0 : !b
  scf.for %i = %c1 to %n step %c1 {
    %stream_index = arith.remui %i, %num_streams : index
    %stream = hir.stream %stream_index
    hir.set_current_stream %stream
    %row = hir.alias_select %b[0 = %i] : !b -> !row
    %out_row = hir.alias_select %out[0 = %i] : !b -> !row
    hir.start_coalescing
    %sent = hir.send %row to %peer backend cuda : !row
    %received = hir.recv %out_row from %peer backend cuda : !row
    %work = hir.end_coalescing
    hir.wait %work
    hir.set_current_stream %main_stream
    hir.synchronize_stream %stream
  }
  func.return
}

// CHECK-LABEL: func.func @from_one(
// CHECK:         scf.for
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NOT:     scf.if
