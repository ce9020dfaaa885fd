// nvFuser's ThreeSetOpsWithDisjointsForLoops (pr4147): the middle copy is not
// stream-parallel, so the first and the last run in two loops.

!t = !fusion.tensor<[?, ?], f32>
!s = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func @three_sets(%in: !t) -> !s {
  %t1 = fusion.set %in : !t -> !s
  %t2 = fusion.set %t1 : !s -> !t
  %t3 = fusion.set %t2 : !t -> !s
  func.return %t3 : !s
}
