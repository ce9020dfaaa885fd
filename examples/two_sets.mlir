// nvFuser's TwoSetOps (pr4147): two stream-parallel copies in a row share one loop.

!in = !fusion.tensor<[?, ?], f32>
!s = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func @two_sets(%in: !in) -> !s {
  %t1 = fusion.set %in : !in -> !s
  %t2 = fusion.set %t1 : !s -> !s
  func.return %t2 : !s
}
