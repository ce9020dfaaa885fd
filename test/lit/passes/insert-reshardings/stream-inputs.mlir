// A fusion input whose stream axis no op streams is refused (nvFuser's
// InputsAreNotStreamParallelized): at the op whose result has that axis serial, or at
// the function when no op uses the input. An input whose stream axis the op's result
// streams too is read slice by slice, as stream-parallel does.
// RUN: hir-opt %s --split-input-file --verify-diagnostics -p insert-reshardings
// RUN: not hir-opt %s --split-input-file -p hir-lowering 2>&1 | filecheck %s

func.func @dropped(%x: !fusion.tensor<[4, 8], f32, axes = [stream, _]>) -> !fusion.tensor<[4, 8], f32> {
  // expected-error@below {{fusion.neg: input #0 of @dropped has stream axis 0 (mesh = [0], axes = [stream, _]), which is axis 0 of the result (mesh = [0], axes = [_, _]), not its stream axis; a fusion's input cannot be stream-parallel alone (nvFuser's InputsAreNotStreamParallelized)}}
  %y = fusion.neg %x : !fusion.tensor<[4, 8], f32, axes = [stream, _]> -> !fusion.tensor<[4, 8], f32>
  func.return %y : !fusion.tensor<[4, 8], f32>
}

// -----

func.func @moved(%x: !fusion.tensor<[4, 8], f32, axes = [stream, _]>) -> !fusion.tensor<[4, 8], f32, axes = [_, stream]> {
  // expected-error@below {{fusion.set: input #0 of @moved has stream axis 0 (mesh = [0], axes = [stream, _]), which is axis 0 of the result (mesh = [0], axes = [_, stream]), not its stream axis}}
  %y = fusion.set %x : !fusion.tensor<[4, 8], f32, axes = [stream, _]> -> !fusion.tensor<[4, 8], f32, axes = [_, stream]>
  func.return %y : !fusion.tensor<[4, 8], f32, axes = [_, stream]>
}

// -----

// expected-error@below {{input #0 of @returned has a stream axis (mesh = [0], axes = [stream, _]) that no op uses}}
func.func @returned(%x: !fusion.tensor<[4, 8], f32, axes = [stream, _]>) -> !fusion.tensor<[4, 8], f32, axes = [stream, _]> {
  func.return %x : !fusion.tensor<[4, 8], f32, axes = [stream, _]>
}

// -----

// CHECK: func.func @streamed
// CHECK: scf.for
// CHECK: hir.alias_select %x[0 = %i
func.func @streamed(%x: !fusion.tensor<[4, 8], f32, axes = [stream, _]>) -> !fusion.tensor<[4, 8], f32, axes = [stream, _]> {
  %y = fusion.neg %x : !fusion.tensor<[4, 8], f32, axes = [stream, _]> -> !fusion.tensor<[4, 8], f32, axes = [stream, _]>
  func.return %y : !fusion.tensor<[4, 8], f32, axes = [stream, _]>
}
