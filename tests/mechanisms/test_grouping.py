"""Parameter grouping (Zhang et al. §4.1, Algorithm 2) on hand-made bounds, and public bounds by hand."""

import math

import pytest
import torch
from torch import nn

from dpsynth.models.dcgan import Discriminator
from dpsynth.mechanisms import grouping
from dpsynth.mechanisms.dpsgd import GradientSanitizer


def bounds_of(groups):
    return [round(c, 6) for _, c in groups]


def test_merges_the_closest_pair_first():
    # 3.0 and 3.1 are closest (gap 0.1) -> √(9 + 9.61); then 1.0 and 1.2 (gap 0.2) -> √2.44
    got = grouping.merge_closest([1.0, 1.2, 3.0, 3.1, 10.0], k=3)
    assert [m for m, _ in got] == [[0, 1], [2, 3], [4]]
    assert bounds_of(got) == [round(math.sqrt(2.44), 6), round(math.sqrt(18.61), 6), 10.0]
    # one more merge: 1.562 vs 4.314 (gap 2.75) beats 4.314 vs 10 (gap 5.69)
    got = grouping.merge_closest([1.0, 1.2, 3.0, 3.1, 10.0], k=2)
    assert [m for m, _ in got] == [[0, 1, 2, 3], [4]]
    assert bounds_of(got) == [round(math.sqrt(1 + 1.44 + 9 + 9.61), 6), 10.0]


def test_a_merged_bound_competes_with_its_new_value():
    # 1 and 1 merge (gap 0) into √2 ≈ 1.414, which is now closer to 1.5 (gap 0.086) than 1.5 was to anything
    got = grouping.merge_closest([1.0, 5.0, 1.0, 1.5], k=2)
    assert [m for m, _ in got] == [[0, 2, 3], [1]]
    assert bounds_of(got) == [round(math.sqrt(1 + 1 + 2.25), 6), 5.0]


def test_merged_bound_is_the_l2_norm_of_its_members_and_k_is_respected():
    bounds = [0.3, 7.0, 0.31, 2.2, 2.0, 0.01, 9.5, 4.4]
    for k in range(1, len(bounds) + 2):
        got = grouping.merge_closest(bounds, k=k)
        assert len(got) == min(k, len(bounds))
        assert sorted(i for m, _ in got for i in m) == list(range(len(bounds)))
        for members, c in got:
            assert c == pytest.approx(math.sqrt(sum(bounds[i] ** 2 for i in members)))


def test_ties_merge_the_lowest_indices():
    got = grouping.merge_closest([1.0, 2.0, 3.0], k=2)  # gaps 1 and 1: (0, 1) merges
    assert [m for m, _ in got] == [[0, 1], [2]]


def test_bad_input():
    with pytest.raises(ValueError, match="k"):
        grouping.merge_closest([1.0], k=0)
    with pytest.raises(ValueError, match="bounds"):
        grouping.merge_closest([1.0, float("nan")], k=1)


def test_fixed_groups_of_the_dcgan_critic():
    names = [n for n, _ in Discriminator(num_classes=3, width=2).named_parameters()]
    assert grouping.fixed_groups(names, strategy="global") == [names]
    weights, biases = grouping.fixed_groups(names, strategy="weight_bias")
    assert weights == ["label_embedding.weight", "net.0.weight", "net.2.weight", "net.4.weight", "net.6.weight"]
    assert biases == ["net.0.bias", "net.2.bias", "net.4.bias", "net.6.bias"]
    assert grouping.fixed_groups(names, strategy="per_layer") == [
        ["label_embedding.weight"], ["net.0.weight", "net.0.bias"], ["net.2.weight", "net.2.bias"],
        ["net.4.weight", "net.4.bias"], ["net.6.weight", "net.6.bias"]]
    assert [grouping.num_groups(names, strategy=s, k=3) for s in grouping.STRATEGIES] == [1, 2, 5, 3]
    assert grouping.num_groups(names, strategy="clustering", k=50) == len(names)
    with pytest.raises(ValueError, match="grouping"):
        grouping.fixed_groups(names, strategy="random")


def test_public_bounds_are_mean_per_example_group_norms():
    # two examples; tensor a holds (3, 4) and (0, 0), tensor b holds (12,) and (5,)
    grads = {"a": torch.tensor([[3.0, 4.0], [0.0, 0.0]]), "b": torch.tensor([[12.0], [5.0]])}
    # group {a, b}: norms 13 and 5 -> 9; group {a}: 5 and 0 -> 2.5; group {b}: 12 and 5 -> 8.5
    assert grouping.public_bounds(grads, [["a", "b"]]) == pytest.approx([9.0])
    assert grouping.public_bounds(grads, [["a"], ["b"]]) == pytest.approx([2.5, 8.5])
    assert grouping.public_bounds({"z": torch.zeros(3, 2)}, [["z"]]) == [1e-6]  # floor keeps bounds positive
    groups, bounds = grouping.cluster_groups(grads, ["a", "b"], k=1)
    assert groups == [["a", "b"]] and bounds == pytest.approx([math.hypot(2.5, 8.5)])


def test_sanitizer_regroup_keeps_k_and_the_parameters():
    lin, other = nn.Linear(3, 2), nn.Linear(1, 1)
    san = GradientSanitizer([[lin.weight], [lin.bias]], max_grad_norm=[1.0, 1.0], noise_multiplier=1.0,
                            expected_batch_size=1)
    san.regroup([[lin.bias], [lin.weight]], [0.5, 2.0])
    assert san.groups == [[lin.bias], [lin.weight]] and san.bounds == [0.5, 2.0]
    with pytest.raises(ValueError, match="groups"):
        san.regroup([[lin.bias, lin.weight]], [1.0])  # k would change the folded release
    with pytest.raises(ValueError, match="groups"):
        san.regroup([[lin.bias], [other.weight]], [1.0, 1.0])
    with pytest.raises(ValueError, match="max_grad_norm"):
        san.regroup([[lin.bias], [lin.weight]], [1.0, 0.0])


def test_doctests():
    import doctest

    assert doctest.testmod(grouping).failed == 0
