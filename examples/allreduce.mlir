// MultiDeviceStreamParallelTypeTest.Allreduce (pr4387): [S, DIDx(D), M] -> sum(1) ->
// [Stream(S), M], one allreduce per slice.

!in = !fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _]>
!out = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _]>

func.func @allreduce(%in: !in) -> !out {
  %out = fusion.sum %in [1] : !in -> !out
  func.return %out : !out
}
