// nvFuser's SingleSetOpNonOutermost (pr4147): the stream axis is axis 1.

!in = !fusion.tensor<[?, ?], f32>
!out = !fusion.tensor<[?, ?], f32, axes = [_, stream]>

func.func @single_set_non_outermost(%in: !in) -> !out {
  %out = fusion.set %in : !in -> !out
  func.return %out : !out
}
