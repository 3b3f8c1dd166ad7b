import math

import numpy as np
import pytest
import simpy

from emulator.timemodel.bandwidth import Bandwidth
from emulator.timemodel.loss import LinkLoss
from emulator.timemodel.network import Network, max_min_shares
from emulator.timemodel.resources import ClientResources, build_resources, draw
from nodes.contracts.rng import stream
from nodes.contracts.schema import Dist, DropoutConfig, Outage, Scenario, SchedulePoint

MBPS = 1e6
MB = 1_000_000  # bytes = 8e6 bits


# --- draw --------------------------------------------------------------------------------


def test_draw_constant_is_exact_and_consumes_no_randomness():
    rng = np.random.default_rng(0)
    assert draw(Dist(kind="constant", value=5e6), 4, rng).tolist() == [5e6] * 4
    assert rng.random() == np.random.default_rng(0).random()


def test_draw_list_cycles():
    assert draw(Dist(kind="list", values=[1.0, 2.0, 3.0]), 7, np.random.default_rng(0)).tolist() == [
        1.0,
        2.0,
        3.0,
        1.0,
        2.0,
        3.0,
        1.0,
    ]


def test_draw_lognormal_median():
    x = draw(Dist(kind="lognormal", median=4e6, sigma=0.8), 100_000, np.random.default_rng(1))
    assert np.median(x) == pytest.approx(4e6, rel=0.02)
    assert np.all(x > 0)


def test_draw_uniform_bounds():
    x = draw(Dist(kind="uniform", low=2.0, high=3.0), 10_000, np.random.default_rng(2))
    assert x.min() >= 2.0 and x.max() < 3.0
    assert x.mean() == pytest.approx(2.5, abs=0.02)


def test_draw_reproducible_under_same_seed():
    d = Dist(kind="lognormal", median=1.0, sigma=1.0)
    a = draw(d, 50, stream(7, "links"))
    b = draw(d, 50, stream(7, "links"))
    c = draw(d, 50, stream(8, "links"))
    assert a.tolist() == b.tolist()
    assert a.tolist() != c.tolist()


def test_draw_unknown_kind_names_it():
    with pytest.raises(ValueError, match="weibull"):
        draw(Dist(kind="weibull"), 3, np.random.default_rng(0))


# --- Bandwidth -----------------------------------------------------------------------------


def test_transfer_seconds_constant_rate():
    bw = Bandwidth(2 * MBPS)
    assert bw.transfer_seconds(MB, 0.0) == 4.0
    assert bw.transfer_seconds(MB, 123.0) == 4.0
    assert bw.rate(10.0) == 2 * MBPS
    assert bw.next_change(0.0) == math.inf


def test_transfer_seconds_across_schedule_change():
    # 1 Mbps for 2 s sends 2e6 bits; the other 6e6 bits at 0.5 Mbps take 12 s.
    bw = Bandwidth(1 * MBPS, [SchedulePoint(t=2.0, factor=0.5)])
    assert bw.transfer_seconds(MB, 0.0) == 14.0
    # starting at 1 s: 1e6 bits before the change, 7e6 after -> 1 + 14
    assert bw.transfer_seconds(MB, 1.0) == 15.0
    # starting after the change: all at 0.5 Mbps
    assert bw.transfer_seconds(MB, 3.0) == 16.0
    # finishing exactly at the change
    assert bw.transfer_seconds(250_000, 0.0) == 2.0


def test_transfer_seconds_several_changes_and_back():
    # 1 Mbps until 1, 4 Mbps on [1, 2), 1 Mbps from 2: 8e6 bits = 1e6 + 4e6 + 3e6 -> 2 + 3 = 5 s
    bw = Bandwidth(1 * MBPS, [SchedulePoint(t=1.0, factor=4.0), SchedulePoint(t=2.0, factor=1.0)])
    assert bw.transfer_seconds(MB, 0.0) == 5.0
    assert bw.rate(0.5) == 1 * MBPS and bw.rate(1.0) == 4 * MBPS and bw.rate(2.0) == 1 * MBPS
    assert bw.next_change(0.0) == 1.0 and bw.next_change(1.0) == 2.0 and bw.next_change(2.0) == math.inf


def test_schedule_points_that_change_nothing_are_not_changes():
    bw = Bandwidth(
        1 * MBPS, [SchedulePoint(t=3.0, factor=1.0), SchedulePoint(t=5.0, factor=0.5), SchedulePoint(t=6.0, factor=0.5)]
    )
    assert bw.next_change(0.0) == 5.0
    assert bw.next_change(5.0) == math.inf


def test_zero_byte_transfer_takes_no_time():
    assert Bandwidth(1 * MBPS, [SchedulePoint(t=0.0, factor=0.1)]).transfer_seconds(0, 5.0) == 0.0


def test_bandwidth_rejects_non_positive_rate():
    with pytest.raises(ValueError, match="bps"):
        Bandwidth(0.0)


# --- LinkLoss ----------------------------------------------------------------------------


def _losses(loss: LinkLoss, n: int, seed: int = 0, direction: str = "up") -> list[bool]:
    rng = np.random.default_rng(seed)
    return [loss.lost(direction, 0.0, 1.0, rng) for _ in range(n)]


def test_bernoulli_p0_never_p1_always():
    assert not any(_losses(LinkLoss(DropoutConfig(model="bernoulli", p=0.0), 0), 1000))
    assert all(_losses(LinkLoss(DropoutConfig(model="bernoulli", p=1.0), 0), 1000))


def test_bernoulli_rate_within_binomial_interval():
    n, p = 2000, 0.3
    k = sum(_losses(LinkLoss(DropoutConfig(model="bernoulli", p=p), 0), n, seed=11))
    half = 2.576 * math.sqrt(n * p * (1 - p))  # 99% normal approximation, ~53 transfers
    assert abs(k - n * p) <= half


def test_none_model_never_loses_and_draws_nothing():
    rng = np.random.default_rng(0)
    assert not LinkLoss(DropoutConfig(model="none"), 0).lost("down", 0.0, 1.0, rng)
    assert rng.random() == np.random.default_rng(0).random()


def test_only_a_loss_model_that_draws_is_given_a_stream():
    assert [LinkLoss(DropoutConfig(model=m), 0).draws for m in ("none", "bernoulli", "gilbert_elliott")] == [
        False,
        True,
        True,
    ]
    assert not LinkLoss(DropoutConfig(model="none"), 0).lost("up", 0.0, 1.0, None)  # no stream built for it
    with pytest.raises(AssertionError, match="generator"):
        LinkLoss(DropoutConfig(model="bernoulli", p=0.5), 0).lost("up", 0.0, 1.0, None)


def test_gilbert_elliott_stationary_loss_rate():
    cfg = DropoutConfig(model="gilbert_elliott", p_good_to_bad=0.1, p_bad_to_good=0.3, loss_good=0.0, loss_bad=1.0)
    pi_bad = 0.1 / (0.1 + 0.3)  # 0.25
    rate = np.mean(_losses(LinkLoss(cfg, 0), 10_000, seed=3))
    assert rate == pytest.approx(pi_bad, abs=0.025)


def test_gilbert_elliott_per_state_loss_probabilities():
    cfg = DropoutConfig(model="gilbert_elliott", p_good_to_bad=0.2, p_bad_to_good=0.2, loss_good=0.1, loss_bad=0.7)
    expected = 0.5 * 0.1 + 0.5 * 0.7
    assert np.mean(_losses(LinkLoss(cfg, 0), 10_000, seed=4)) == pytest.approx(expected, abs=0.03)


def test_gilbert_elliott_starts_good_and_transitions_first():
    stays_good = DropoutConfig(
        model="gilbert_elliott", p_good_to_bad=0.0, p_bad_to_good=1.0, loss_good=0.0, loss_bad=1.0
    )
    assert not any(_losses(LinkLoss(stays_good, 0), 200))
    # with P(good -> bad) = 1 the very first transfer already sees the bad state
    goes_bad = DropoutConfig(model="gilbert_elliott", p_good_to_bad=1.0, p_bad_to_good=0.0, loss_good=0.0, loss_bad=1.0)
    assert all(_losses(LinkLoss(goes_bad, 0), 200))


def test_gilbert_elliott_is_bursty_and_state_persists_across_calls():
    cfg = DropoutConfig(model="gilbert_elliott", p_good_to_bad=0.05, p_bad_to_good=0.05, loss_good=0.0, loss_bad=1.0)
    loss = LinkLoss(cfg, 0)
    seq = np.array(_losses(loss, 4000, seed=5))
    # P(lost | previous lost) = 1 - p_bad_to_good = 0.95, far above the 0.5 loss rate
    assert np.mean(seq[1:][seq[:-1]]) == pytest.approx(0.95, abs=0.03)


def test_outage_overlap_cases():
    cfg = DropoutConfig(outages=[Outage(clients=[1, 2], start=10.0, end=20.0)])
    loss = LinkLoss(cfg, client_id=1)
    rng = np.random.default_rng(0)
    assert loss.lost("up", 12.0, 15.0, rng)  # inside
    assert loss.lost("up", 5.0, 11.0, rng)  # over the start edge
    assert loss.lost("up", 19.0, 25.0, rng)  # over the end edge
    assert loss.lost("up", 5.0, 25.0, rng)  # covers the window
    assert not loss.lost("up", 0.0, 9.0, rng)  # before
    assert not loss.lost("up", 21.0, 30.0, rng)  # after
    assert not loss.lost("up", 5.0, 10.0, rng)  # ends as the outage starts
    assert not loss.lost("up", 20.0, 22.0, rng)  # starts as the link comes back
    assert loss.lost("up", 10.0, 10.0, rng)  # zero-length at the start: link is down
    assert not LinkLoss(cfg, client_id=0).lost("up", 12.0, 15.0, rng)  # client not listed


def test_outage_with_no_clients_applies_to_all():
    cfg = DropoutConfig(outages=[Outage(clients=[], start=1.0, end=2.0)])
    rng = np.random.default_rng(0)
    assert all(LinkLoss(cfg, i).lost("down", 0.5, 1.5, rng) for i in range(5))


def test_direction_filter():
    rng = np.random.default_rng(0)
    up_only = LinkLoss(
        DropoutConfig(model="bernoulli", p=1.0, direction="up", outages=[Outage(start=0.0, end=100.0)]), 0
    )
    assert up_only.lost("up", 1.0, 2.0, rng)
    assert not up_only.lost("down", 1.0, 2.0, rng)  # neither the model nor the outage
    down_only = LinkLoss(DropoutConfig(model="bernoulli", p=1.0, direction="down"), 0)
    assert down_only.lost("down", 1.0, 2.0, rng) and not down_only.lost("up", 1.0, 2.0, rng)
    with pytest.raises(ValueError, match="sideways"):
        up_only.lost("sideways", 0.0, 1.0, rng)


def test_draws_per_call_do_not_depend_on_outcome_or_direction():
    # two processes fed the same stream stay in lock-step although their outcomes differ
    for model in ("bernoulli", "gilbert_elliott"):
        a = LinkLoss(DropoutConfig(model=model, p=0.5, direction="up"), 0)
        b = LinkLoss(DropoutConfig(model=model, p=0.5, outages=[Outage(start=0.0, end=5.0)]), 0)
        rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
        for k in range(50):
            a.lost("down" if k % 2 else "up", float(k), k + 1.0, rng_a)
            b.lost("up", float(k), k + 1.0, rng_b)
        assert rng_a.random() == rng_b.random()
    never = LinkLoss(DropoutConfig(model="bernoulli", p=0.0), 0)
    always = LinkLoss(DropoutConfig(model="bernoulli", p=1.0), 0)
    rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
    for _ in range(10):
        never.lost("up", 0.0, 1.0, rng_a)
        always.lost("up", 0.0, 1.0, rng_b)
    assert rng_a.random() == rng_b.random()


def test_same_seed_same_loss_sequence():
    cfg = DropoutConfig(model="gilbert_elliott", p_good_to_bad=0.2, p_bad_to_good=0.4, loss_good=0.05, loss_bad=0.9)
    a = _losses(LinkLoss(cfg, 3), 500, seed=42)
    b = _losses(LinkLoss(cfg, 3), 500, seed=42)
    c = _losses(LinkLoss(cfg, 3), 500, seed=43)
    assert a == b and a != c


# --- ClientResources / build_resources -----------------------------------------------------


def _client(cid=0, down=1 * MBPS, up=1 * MBPS, latency=0.0, schedule=(), step=0.05):
    return ClientResources(
        client_id=cid,
        down=Bandwidth(down, schedule),
        up=Bandwidth(up, schedule),
        latency_s=latency,
        step_s=step,
        loss=LinkLoss(DropoutConfig(), cid),
    )


def test_client_times():
    c = _client(down=4 * MBPS, up=1 * MBPS, latency=0.25, step=0.1)
    assert c.download_time(MB, 0.0) == 0.25 + 2.0
    assert c.upload_time(MB, 0.0) == 0.25 + 8.0
    assert c.compute_time(30, 0.0) == pytest.approx(3.0)
    # the bits start after the latency: a change at t=0.25 already applies to all of them
    slow = _client(down=4 * MBPS, latency=0.25, schedule=[SchedulePoint(t=0.25, factor=0.5)])
    assert slow.download_time(MB, 0.0) == 0.25 + 4.0


def test_build_resources_draw_order_and_reproducibility():
    cfg = Scenario()
    cfg.clients.n = 5
    cfg.links.down_bps = Dist(kind="lognormal", median=10e6, sigma=0.5)
    cfg.links.up_bps = Dist(kind="uniform", low=1e6, high=2e6)
    cfg.links.latency_s = Dist(kind="list", values=[0.01, 0.02])
    cfg.compute.step_s = Dist(kind="lognormal", median=0.1, sigma=0.3)
    cfg.links.schedule = [SchedulePoint(t=100.0, factor=0.5)]
    clients = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 3)
    rng = stream(3, "links")
    down = rng.lognormal(np.log(10e6), 0.5, 5)
    up = rng.uniform(1e6, 2e6, 5)
    step = rng.lognormal(np.log(0.1), 0.3, 5)
    assert [c.client_id for c in clients] == [0, 1, 2, 3, 4]
    assert [c.down.rate(0.0) for c in clients] == down.tolist()
    assert [c.up.rate(0.0) for c in clients] == up.tolist()
    assert [c.latency_s for c in clients] == [0.01, 0.02, 0.01, 0.02, 0.01]
    assert [c.step_s for c in clients] == step.tolist()
    assert clients[0].up.rate(100.0) == up[0] * 0.5
    again = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 3)
    assert [c.down.rate(0) for c in again] == down.tolist()
    other_seed = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 4)
    assert [c.down.rate(0) for c in other_seed] != down.tolist()


# --- Network -------------------------------------------------------------------------------


def _transfer_procs(env, net, transfers):
    finish, delivered, procs = {}, {}, []
    for k, (cid, direction, nbytes) in enumerate(transfers):
        proc = env.process(net.transfer(cid, direction, nbytes))

        def record(ev, k=k):
            finish[k], delivered[k] = env.now, ev.value

        proc.callbacks.append(record)
        procs.append(proc)
    return procs, finish, delivered


def test_single_transfer_unlimited_link_is_latency_plus_bits_over_rate():
    env = simpy.Environment()
    net = Network(env, [_client(down=2 * MBPS, latency=0.1)])
    _procs, finish, delivered = _transfer_procs(env, net, [(0, "down", MB)])
    env.run()
    assert finish[0] == 0.1 + 4.0 == env.now
    assert delivered[0] is True


def test_zero_byte_transfer_is_latency_only():
    env = simpy.Environment()
    net = Network(env, [_client(latency=0.3)], server_down_bps=1 * MBPS)
    _procs, finish, delivered = _transfer_procs(env, net, [(0, "down", 0)])
    env.run()
    assert finish[0] == 0.3 and delivered[0]


def test_unlimited_network_agrees_with_client_times_across_schedule_change():
    c = _client(down=1 * MBPS, up=1 * MBPS, latency=0.5, schedule=[SchedulePoint(t=2.5, factor=0.5)])
    env = simpy.Environment()
    net = Network(env, [c])
    _procs, finish, _ = _transfer_procs(env, net, [(0, "down", MB)])
    env.run()
    assert finish[0] == c.download_time(MB, 0.0) == 14.5


def test_two_equal_transfers_on_shared_capacity_take_twice_as_long():
    clients = [_client(0, down=10 * MBPS), _client(1, down=10 * MBPS)]
    env = simpy.Environment()
    net = Network(env, clients, server_down_bps=2 * MBPS)
    _, alone, _ = _transfer_procs(env, net, [(0, "down", MB)])
    env.run()
    assert alone[0] == pytest.approx(4.0)  # capped by the server link, not the client's 10 Mbps
    env = simpy.Environment()
    net = Network(env, clients, server_down_bps=2 * MBPS)
    _, together, _ = _transfer_procs(env, net, [(0, "down", MB), (1, "down", MB)])
    env.run(until=1.0)
    assert net.rates("down") == {0: 1 * MBPS, 1: 1 * MBPS}
    env.run()
    assert together[0] == pytest.approx(8.0) and together[1] == pytest.approx(8.0)
    assert net.rates("down") == {}


def test_max_min_slow_client_keeps_its_rate_fast_one_gets_the_rest():
    # C = 3 Mbps; fair share 1.5. Client 0 can only do 1 Mbps -> keeps 1; client 1 gets 2.
    # client 0: 2e6 bits / 1 Mbps = 2 s.  client 1: 4e6 bits by t=2, then 2e6 left at 3 Mbps -> 2 + 2/3.
    clients = [_client(0, down=1 * MBPS), _client(1, down=10 * MBPS)]
    env = simpy.Environment()
    net = Network(env, clients, server_down_bps=3 * MBPS)
    _, finish, _ = _transfer_procs(env, net, [(0, "down", 250_000), (1, "down", 750_000)])
    env.run(until=1.0)
    assert net.rates("down") == {0: 1 * MBPS, 1: 2 * MBPS}
    env.run()
    assert finish[0] == pytest.approx(2.0, rel=1e-12)
    assert finish[1] == pytest.approx(2.0 + 2.0 / 3.0, rel=1e-12)


def test_max_min_shares_water_filling():
    assert max_min_shares(10.0, [1.0, 2.0, 20.0, 20.0]) == [1.0, 2.0, 3.5, 3.5]
    assert max_min_shares(10.0, [1.0, 2.0]) == [1.0, 2.0]  # capacity not binding
    assert max_min_shares(9.0, [5.0, 5.0, 5.0]) == [3.0, 3.0, 3.0]
    assert max_min_shares(9.0, []) == []


def test_interrupting_one_transfer_speeds_up_the_other():
    # C = 2 Mbps shared by two 4e6-bit transfers at 1 Mbps each. At t=1 client 0 is cut off;
    # client 1 has 3e6 bits left and now gets 2 Mbps -> done at 2.5 (4.0 without the cut).
    clients = [_client(0, down=10 * MBPS), _client(1, down=10 * MBPS)]
    env = simpy.Environment()
    net = Network(env, clients, server_down_bps=2 * MBPS)
    procs, finish, delivered = _transfer_procs(env, net, [(0, "down", 500_000), (1, "down", 500_000)])

    def deadline():
        yield env.timeout(1.0)
        procs[0].interrupt("deadline")

    env.process(deadline())
    env.run(until=1.5)
    assert finish[0] == 1.0 and delivered[0] is False
    assert net.rates("down") == {1: 2 * MBPS}
    env.run()
    assert finish[1] == pytest.approx(2.5, rel=1e-12) and delivered[1] is True


def test_interrupt_during_latency_never_joins_the_pool():
    clients = [_client(0, down=10 * MBPS, latency=5.0), _client(1, down=10 * MBPS)]
    env = simpy.Environment()
    net = Network(env, clients, server_down_bps=1 * MBPS)
    procs, finish, delivered = _transfer_procs(env, net, [(0, "down", MB), (1, "down", MB)])

    def deadline():
        yield env.timeout(1.0)
        procs[0].interrupt()

    env.process(deadline())
    env.run()
    assert finish[0] == 1.0 and delivered[0] is False
    assert finish[1] == pytest.approx(8.0, rel=1e-12)


def test_interrupt_on_unlimited_link():
    env = simpy.Environment()
    net = Network(env, [_client(down=1 * MBPS)])
    procs, finish, delivered = _transfer_procs(env, net, [(0, "down", MB)])

    def deadline():
        yield env.timeout(3.0)
        procs[0].interrupt()

    env.process(deadline())
    env.run()
    assert finish[0] == 3.0 and delivered[0] is False


def test_late_joiner_shares_from_when_it_arrives():
    # C = 1 Mbps. Client 0 (no latency) sends 2e6 bits, alone on [0, 1) -> 1e6 left.
    # Client 1 arrives after 1 s latency with 1e6 bits; both at 0.5 Mbps -> both done at 3.
    clients = [_client(0, down=10 * MBPS), _client(1, down=10 * MBPS, latency=1.0)]
    env = simpy.Environment()
    net = Network(env, clients, server_down_bps=1 * MBPS)
    _, finish, _ = _transfer_procs(env, net, [(0, "down", 250_000), (1, "down", 125_000)])
    env.run()
    assert finish[0] == pytest.approx(3.0, rel=1e-12) and finish[1] == pytest.approx(3.0, rel=1e-12)


def test_directions_have_separate_pools():
    clients = [_client(0, down=10 * MBPS, up=10 * MBPS), _client(1, down=10 * MBPS, up=10 * MBPS)]
    env = simpy.Environment()
    net = Network(env, clients, server_down_bps=1 * MBPS, server_up_bps=2 * MBPS)
    _, finish, _ = _transfer_procs(env, net, [(0, "down", MB), (1, "up", MB)])
    env.run()
    assert finish[0] == pytest.approx(8.0) and finish[1] == pytest.approx(4.0)


def test_schedule_change_mid_transfer_on_shared_link():
    # C = 1 Mbps, both fair at 0.5 Mbps on [0, 1) -> each has 0.5e6 of 1e6 bits left.
    # At t=1 client 0's own link drops to 0.25 Mbps (< fair share): it keeps 0.25, client 1 gets 0.75
    # -> client 1 done at 1 + 0.5/0.75 = 5/3; client 0 then has 1/3e6 left alone at 0.25 -> done at 3.
    clients = [_client(0, down=1 * MBPS, schedule=[SchedulePoint(t=1.0, factor=0.25)]), _client(1, down=10 * MBPS)]
    env = simpy.Environment()
    net = Network(env, clients, server_down_bps=1 * MBPS)
    _, finish, _ = _transfer_procs(env, net, [(0, "down", 125_000), (1, "down", 125_000)])
    env.run(until=1.2)
    assert net.rates("down") == {0: 0.25 * MBPS, 1: 0.75 * MBPS}
    env.run()
    assert finish[1] == pytest.approx(5.0 / 3.0, rel=1e-12)
    assert finish[0] == pytest.approx(3.0, rel=1e-12)


def test_schedule_change_mid_transfer_when_capacity_does_not_bind():
    # the shared link (100 Mbps) never binds, so the client's own schedule decides: 14 s as alone
    c = _client(down=1 * MBPS, schedule=[SchedulePoint(t=2.0, factor=0.5)])
    env = simpy.Environment()
    net = Network(env, [c], server_down_bps=100 * MBPS)
    _, finish, _ = _transfer_procs(env, net, [(0, "down", MB)])
    env.run()
    assert finish[0] == pytest.approx(14.0, rel=1e-12)


def test_many_random_flows_conserve_bits():
    # fluid conservation: with C binding throughout, n equal flows started together all end at n*bits/C
    n = 7
    clients = [_client(i, down=(i + 1) * 10 * MBPS) for i in range(n)]
    env = simpy.Environment()
    net = Network(env, clients, server_down_bps=3 * MBPS)
    _, finish, delivered = _transfer_procs(env, net, [(i, "down", 30_000) for i in range(n)])
    env.run()
    assert all(delivered.values())
    assert max(finish.values()) == pytest.approx(n * 240_000 / (3 * MBPS), rel=1e-9)
