"""Trace-driven rates, availability windows and time-varying compute, against times computed by hand."""

import math

import numpy as np
import pytest
import simpy

from emulator.config import SCENARIO_DIR, ConfigError, load
from emulator.policies import OutcomeLog
from emulator.policies.system import client_infos
from emulator.timemodel.availability import ALWAYS, Availability, DiurnalWindows, build_availability
from emulator.timemodel.bandwidth import Bandwidth
from emulator.timemodel.loss import LinkLoss
from emulator.timemodel.network import Network
from emulator.timemodel.resources import ClientResources, build_resources
from emulator.timemodel.traces import PacketTrace, PiecewiseRate, TracedBandwidth, TraceError, read_link_trace
from nodes.contracts.schema import AvailabilityConfig, DropoutConfig, SchedulePoint

MTU = 1500


def mahimahi(tmp_path, stamps, name="link.down"):
    path = tmp_path / name
    path.write_text("".join(f"{s}\n" for s in stamps))
    return str(path)


# --- Mahimahi packet traces -----------------------------------------------------------------

# opportunities at 0, 0, 5 and 10 ms; period 10 ms: then 10, 10, 15, 20, 20, 20, 25, 30 ...
TINY = [0, 0, 5, 10]


def test_mahimahi_delivery_is_the_ceil_bytes_over_mtu_th_opportunity_at_or_after_the_start():
    trace = PacketTrace(np.array(TINY))
    assert trace.period == 0.010 and trace.bps == 4 * MTU * 8 / 0.010
    assert trace.delivery_seconds(1, 0.0) == 0.0  # first opportunity, at 0
    assert trace.delivery_seconds(2 * MTU, 0.0) == 0.0  # two at 0 ms
    assert trace.delivery_seconds(2 * MTU + 1, 0.0) == 0.005  # a third packet: the one at 5 ms
    assert trace.delivery_seconds(4 * MTU, 0.0) == 0.010
    assert trace.delivery_seconds(0, 3.0) == 0.0


def test_mahimahi_wraps_around_with_period_the_last_timestamp():
    trace = PacketTrace(np.array(TINY))
    # the 5th and 6th opportunities are the repetition's two at 0 ms, i.e. at 10 ms; the 7th at 15 ms
    assert trace.delivery_seconds(6 * MTU, 0.0) == 0.010
    assert trace.delivery_seconds(7 * MTU, 0.0) == pytest.approx(0.015, abs=1e-15)
    # from 6 ms: 10 (x3: the last stamp and the next period's two zeros), 15, 20 (x3) -> 5 packets end at 20 ms
    assert trace.delivery_seconds(5 * MTU, 0.006) == pytest.approx(0.014, abs=1e-15)
    # 100 periods later it is the same
    assert trace.delivery_seconds(5 * MTU, 1.006) == pytest.approx(0.014, abs=1e-12)


def test_a_traced_bandwidth_starts_at_its_offset_into_the_trace(tmp_path):
    trace = read_link_trace(mahimahi(tmp_path, TINY))
    bw = TracedBandwidth(trace, offset_s=0.006)
    assert bw.transfer_seconds(5 * MTU, 0.0) == pytest.approx(0.014, abs=1e-15)
    assert bw.bps == trace.bps


def test_the_fluid_equivalent_spreads_each_timestamps_packets_over_the_gap_before_it():
    fluid = PacketTrace(np.array(TINY)).fluid
    # (0, 5]: the packet at 5 ms; (5, 10]: the one at 10 and the repetition's two at 0 = 3 packets
    assert fluid.rate(0.001) == MTU * 8 / 0.005
    assert fluid.rate(0.007) == 3 * MTU * 8 / 0.005
    assert fluid.next_change(0.001) == 0.005 and fluid.next_change(0.005) == 0.010
    # it agrees with the packets at every opportunity: 4 packets a period
    assert fluid.seconds(4 * MTU * 8, 0.0) == pytest.approx(0.010)


def test_a_transfer_over_a_1_mb_trace_takes_about_its_size_over_the_traces_mean_rate():
    path = SCENARIO_DIR / "traces" / "Verizon-LTE-short.up"  # 434 kB
    trace = read_link_trace(str(path))
    ends = [trace.delivery_seconds(10**7, t) for t in np.linspace(0, 1000, 2000)]
    mean = 10**7 * 8 / trace.bps
    assert 0.5 * mean < np.median(ends) < 2 * mean


# --- CSV rate traces ------------------------------------------------------------------------------


def test_csv_steps_integrate_exactly_and_repeat_after_the_last_row(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("t_s,bps\n0,1e6\n2,3e6\n4,0\n")  # 1 Mbit/s on [0,2), 3 Mbit/s on [2,4), repeats every 4 s
    bw = TracedBandwidth(read_link_trace(str(path)))
    assert bw.bps == 2e6
    assert bw.transfer_seconds(250_000, 0.0) == 2.0  # 2e6 bits at 1 Mbit/s
    assert bw.transfer_seconds(1_000_000, 0.0) == 4.0  # 2e6 + 6e6 bits: one whole period
    assert bw.transfer_seconds(1_125_000, 0.0) == 5.0  # 9e6 bits: one more second at 1 Mbit/s
    assert bw.transfer_seconds(250_000, 3.5) == 1.0  # 2e6 bits: 1.5e6 by 4 s, 0.5e6 at 1 Mbit/s
    assert bw.rate(5.0) == 1e6 and bw.next_change(3.0) == 4.0 and bw.next_change(4.0) == 6.0


def test_mean_rate_over_a_window_integrates_traces_and_schedules(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("t_s,bps\n0,1e6\n2,3e6\n4,0\n")  # 1 Mbit/s on [0,2), 3 Mbit/s on [2,4), repeats every 4 s
    bw = TracedBandwidth(read_link_trace(str(path)))
    assert bw.mean_rate(1.0, 3.0) == 2e6
    assert bw.mean_rate(-1.0, 1.0) == 2e6  # [-1, 0) is [3, 4) of the previous period: 3 Mbit/s
    assert TracedBandwidth(read_link_trace(str(path)), offset_s=2.0).mean_rate(0.0, 1.0) == 3e6
    schedule = Bandwidth(8e6, [SchedulePoint(t=2.0, factor=0.5)])
    assert schedule.mean_rate(1.0, 3.0) == 6e6 and schedule.mean_rate(-1.0, 0.0) == 8e6


def test_a_client_reports_its_links_last_window_and_its_current_device_speed(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("t_s,bps\n0,1e6\n2,3e6\n4,0\n")
    cfg = load(
        None,
        [
            "clients.n=1",
            f"links.trace.down=[{path}]",
            f"links.trace.up=[{path}]",
            "compute.step_s.value=0.5",
            "compute.schedule=[{t: 2.0, factor: 2.0}]",
        ],
    )
    info = client_infos(
        build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 0), [100], OutcomeLog(1)
    )[0]
    assert (info.down_bps, info.up_bps, info.step_s) == (2e6, 2e6, 0.5)  # nominal: the trace's mean
    now = info.reported(3.0, window_s=1.0)
    assert (now.down_bps, now.up_bps, now.step_s) == (3e6, 3e6, 1.0)
    assert info.reported(2.0, window_s=1.0).down_bps == 1e6  # the rate of [1, 2), not the one starting at 2
    assert info.reported(2.0, window_s=4.0).down_bps == 2e6  # [-2, 0) is the previous period's 3 Mbit/s
    assert info.reported(0.5, window_s=1.0).step_s == 0.5  # before the schedule's change: the drawn speed
    assert now.history is info.history and now.client == info.client


def test_a_csv_trace_at_zero_rate_waits_for_the_rate_to_come_back():
    rate = PiecewiseRate([0, 1, 2], [2.0, 0.0, 2.0], period=3.0)
    assert rate.seconds(2.5, 0.0) == 2.25  # 2 units by 1 s, nothing on [1, 2), 0.5 more at 2 units/s
    assert rate.seconds(1.0, 1.5) == 1.0
    assert rate.seconds(4.0, 0.0) == 3.0


def test_a_trace_on_the_shared_link_is_integrated_exactly_in_the_max_min_split(tmp_path):
    """Client 0's downlink follows 1 Mbit/s on [0, 2) then 4 Mbit/s (period 10 s); client 1 has 4 Mbit/s;
    the server sends 4 Mbit/s. On [0, 2): shares 1 and 3; from 2: 2 and 2."""
    path = tmp_path / "steps.csv"
    path.write_text("0,1e6\n2,4e6\n10,4e6\n")
    loss = LinkLoss(DropoutConfig(), 0)
    steps = TracedBandwidth(read_link_trace(str(path)))
    traced = ClientResources(0, steps, steps, 0.0, 0.0, loss)
    plain = ClientResources(1, *[TracedBandwidth(PiecewiseRate([0], [4e6]))] * 2, 0.0, 0.0, loss)
    env = simpy.Environment()
    net = Network(env, [traced, plain], server_down_bps=4e6)
    finish = {}

    def send(c, nbytes):
        yield env.process(net.transfer(c, "down", nbytes))
        finish[c] = env.now

    # client 1: 1 MB = 8e6 bits: 6e6 by 2 s, 2e6 at 2 Mbit/s -> 3 s; then client 0 alone gets 4 Mbit/s
    env.process(send(0, 1_000_000))
    env.process(send(1, 1_000_000))
    env.run()
    assert finish[1] == pytest.approx(3.0, rel=1e-12)
    # client 0: 2e6 (0-2 s) + 2e6 (2-3 s) + 4e6 at 4 Mbit/s = 1 s -> 4 s
    assert finish[0] == pytest.approx(4.0, rel=1e-12)


# --- compute ----------------------------------------------------------------------------------------


def test_compute_schedule_integrates_the_step_rate(tmp_path):
    cfg = load(None, ["clients.n=1", "compute.step_s.value=0.5", "compute.schedule=[{t: 2.0, factor: 2.0}]"])
    c = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 0)[0]
    assert c.compute_time(4, 0.0) == 2.0  # 4 steps at 0.5 s
    assert c.compute_time(6, 0.0) == 4.0  # 4 by 2 s, then 2 steps at 1 s each
    assert c.compute_time(2, 3.0) == 2.0


def test_compute_trace_of_seconds_per_step_repeats(tmp_path):
    path = tmp_path / "phone.csv"
    path.write_text("t_s,step_s\n0,0.5\n2,0.25\n3,0.5\n")  # 4 steps on [0,2), 4 on [2,3); period 3 s
    cfg = load(None, ["clients.n=2", f"compute.trace.files=[{path}]"])
    c = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 0)[0]
    assert c.compute_time(8, 0.0) == 3.0
    assert c.compute_time(10, 0.0) == 4.0  # the trace repeats: 2 more steps at 0.5 s
    assert c.compute_time(2, 2.5) == 0.5
    assert c.step_s == 0.05  # the nominal draw is kept


# --- availability -----------------------------------------------------------------------------------


def test_availability_windows_and_their_transitions():
    a = Availability([(10.0, 20.0), (30.0, 40.0)])
    assert not a.available(5.0) and a.available(10.0) and not a.available(20.0)
    assert a.next_unavailable(5.0) == 5.0 and a.next_unavailable(15.0) == 20.0
    assert a.next_available(5.0) == 10.0 and a.next_available(25.0) == 30.0 and a.next_available(45.0) == math.inf
    daily = Availability([(0.0, 2.0), (8.0, 10.0)], period=10.0)  # 8..12 wraps into the next period
    assert daily.next_unavailable(9.0) == 12.0 and daily.next_available(15.0) == 18.0


def diurnal_window(cfg, phase_s, threshold):
    """One client's diurnal window, by the scalar formula (the reference the arrays must equal bit for bit)."""
    period = cfg.period_s
    if cfg.amplitude == 0 or abs(threshold - cfg.mean) >= cfg.amplitude:
        return ALWAYS if cfg.mean > threshold else Availability([])
    a = math.asin((threshold - cfg.mean) / cfg.amplitude)
    start = (a / (2 * math.pi) * period - phase_s) % period
    end = start + (math.pi - 2 * a) / (2 * math.pi) * period
    if end <= period:
        return Availability([(start, end)], period)
    return Availability([(start, period), (0.0, end - period)], period)


@pytest.mark.parametrize(("mean", "amplitude"), [(0.6, 0.3), (0.5, 0.5), (0.9, 0.4), (0.3, 0.0)])
def test_diurnal_windows_on_arrays_are_the_scalar_formulas_bit_for_bit(mean, amplitude):
    cfg = AvailabilityConfig(model="diurnal", period_s=86400.0, mean=mean, amplitude=amplitude, phase_spread_s=86400.0)
    rng = np.random.default_rng(5)
    phase, threshold = rng.random(3000) * cfg.phase_spread_s, rng.random(3000)
    threshold[:4] = [mean, mean + amplitude, mean - amplitude, 0.0]  # on the sinusoid's extremes and centre
    phase[:2] = [0.0, 86400.0 - 1e-9]
    windows = DiurnalWindows(cfg, phase, threshold)
    for i in range(3000):
        got, want = windows.window(i), diurnal_window(cfg, phase[i], threshold[i])
        assert (got.starts, got.ends, got.period) == (want.starts, want.ends, want.period), i
    times = np.concatenate([rng.random(40) * 3 * 86400, [0.0, 86400.0, 2 * 86400.0 - 1e-7]])
    for t in times:
        assert windows.member(np.arange(3000), t).tolist() == [
            diurnal_window(cfg, phase[i], threshold[i]).available(t) for i in range(3000)
        ]


def test_diurnal_availability_follows_the_sinusoid_and_is_deterministic_per_seed():
    cfg = AvailabilityConfig(model="diurnal", period_s=100.0, mean=0.5, amplitude=0.4, phase_spread_s=0.0)
    # u = 0.7: sin(2 pi t / 100) > 0.5 for t in (100/12, 500/12)
    a = DiurnalWindows(cfg, np.array([0.0]), np.array([0.7])).window(0)
    assert a.starts[0] == pytest.approx(100 / 12) and a.ends[0] == pytest.approx(500 / 12)
    assert a.available(25.0) and not a.available(75.0) and a.available(125.0)
    n = 400
    clients = build_availability(cfg, n, seed=3)
    for t, p in ((25.0, 0.9), (75.0, 0.1), (0.0, 0.5)):  # P(available at t) = p(t)
        share = np.mean([c.available(t) for c in clients])
        assert abs(share - p) < 3 * math.sqrt(p * (1 - p) / n) + 1e-9, (t, share)
    again = build_availability(cfg, n, seed=3)
    assert [c.next_available(60.0) for c in clients] == [c.next_available(60.0) for c in again]
    assert [c.available(30.0) for c in build_availability(cfg, n, seed=4)] != [c.available(30.0) for c in clients]
    # a client's windows do not depend on how many clients there are
    assert [c.next_unavailable(1.0) for c in build_availability(cfg, 5, seed=3)] == [
        c.next_unavailable(1.0) for c in clients[:5]
    ]


def test_csv_availability_happens_once_or_repeats_with_repeat_s(tmp_path):
    path = tmp_path / "week.csv"
    path.write_text("client,t_start,t_end\n0,2,5\n0,8,10\n")  # client 1 has no rows: always available
    once, always = build_availability(AvailabilityConfig(model="csv", file=str(path)), 2, seed=0)
    assert always.available(1e9)
    assert once.next_available(6.0) == 8.0 and once.next_available(10.0) == math.inf
    weekly, _ = build_availability(AvailabilityConfig(model="csv", file=str(path), repeat_s=10.0), 2, seed=0)
    assert weekly.next_available(10.0) == 12.0 and weekly.available(23.0) and not weekly.available(26.0)
    assert weekly.next_unavailable(29.0) == 30.0 and weekly.next_available(30.0) == 32.0
    with pytest.raises(ConfigError, match=r"^availability.file = .*t_end = 10: expected <= availability.repeat_s = 9"):
        load(None, ["clients.n=2", "availability.model=csv", f"availability.file={path}", "availability.repeat_s=9"])


# --- validation --------------------------------------------------------------------------------------


def test_trace_paths_resolve_next_to_the_scenario_then_in_scenarios(tmp_path):
    (tmp_path / "mine.up").write_text("1\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("links: {trace: {up: [mine.up], down: [traces/ATT-LTE-driving-2016.down]}}\n")
    cfg = load(str(scenario))
    assert cfg.links.trace.up == [str((tmp_path / "mine.up").resolve())]
    assert cfg.links.trace.down == [str(SCENARIO_DIR / "traces" / "ATT-LTE-driving-2016.down")]
    up = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 0)[0].up
    assert up.bps == MTU * 8 / 0.001  # "1": one packet per ms = 12 Mbit/s


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "file not found"),
        ("", "empty"),
        ("0\n5\nfive\n", "line 3"),
        ("10\n5\n", "non-decreasing"),
        ("0\n0\n", "period"),
    ],
)
def test_a_bad_trace_file_is_one_error_naming_its_key(tmp_path, content, problem):
    path = tmp_path / "bad.down"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as e:
        load(None, [f"links.trace.down=[{path}]"])
    assert str(e.value).startswith("links.trace.down[0] = ") and problem in str(e.value), e.value


@pytest.mark.parametrize(
    "content, problem",
    [
        ("0,1e6\n", "at least 2 rows"),
        ("1,1e6\n2,1e6\n", "expected 0"),
        ("0,1e6\n0,2e6\n", "strictly increasing"),
        ("0,-1\n2,1\n", ">= 0"),
        ("0,0\n2,0\n", "delivers"),
        ("0,1e6,3\n2,1\n", "2 comma-separated"),
    ],
)
def test_a_bad_csv_trace_is_one_error_naming_its_key(tmp_path, content, problem):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        load(None, [f"links.trace.up=[{path}]"])
    assert str(e.value).startswith("links.trace.up[0] = ") and problem in str(e.value), e.value


def test_trace_options_that_conflict_are_refused(tmp_path):
    up = SCENARIO_DIR / "traces" / "ATT-LTE-driving-2016.up"
    with pytest.raises(ConfigError, match=r"^links.schedule = "):
        load(None, [f"links.trace.up=[{up}]", "links.schedule=[{t: 1, factor: 2}]"])
    with pytest.raises(ConfigError, match=r"^links.trace.up = .*assign=same"):
        load(None, [f"links.trace.up=[{up},{up}]", "links.trace.assign=same"])
    with pytest.raises(ConfigError, match=r"^links.trace.offset = "):
        load(None, ["links.trace.offset=middle"])
    with pytest.raises(ConfigError, match=r"^availability.file = .*line 2"):
        bad = SCENARIO_DIR / "traces" / "phone-throttle.csv"  # not client,t_start,t_end rows
        load(None, ["availability.model=csv", f"availability.file={bad}"])
    with pytest.raises(TraceError):
        read_link_trace(str(SCENARIO_DIR / "nothing.down"))


def test_assignment_rules_and_offsets_per_client():
    down = [f"traces/{name}.down" for name in ("ATT-LTE-driving-2016", "Verizon-LTE-short")]
    listed = f"links.trace.down=[{','.join(down)}]"

    def names(cfg):
        return [c.down.name for c in build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)]

    robin = names(load(None, ["clients.n=4", listed]))
    assert robin == ["ATT-LTE-driving-2016.down", "Verizon-LTE-short.down"] * 2
    assert set(names(load(None, ["clients.n=4", f"links.trace.down=[{down[0]}]", "links.trace.assign=same"]))) == {
        "ATT-LTE-driving-2016.down"
    }
    random = load(None, ["clients.n=30", listed, "links.trace.assign=random", "links.trace.offset=random"])
    clients = build_resources(random.links, random.compute, random.availability, random.clients.n, random.seed)
    assert set(names(random)) == {"ATT-LTE-driving-2016.down", "Verizon-LTE-short.down"}
    assert len({c.down.offset_s for c in clients}) == 30 and all(0 <= c.down.offset_s < 140 for c in clients)
    # a client's pick depends on its seed and id only, not on how many clients there are
    three = load(None, ["clients.n=3", listed, "links.trace.assign=random", "links.trace.offset=random"])
    fewer = build_resources(three.links, three.compute, three.availability, three.clients.n, random.seed)
    assert [(c.down.name, c.down.offset_s) for c in fewer] == [(c.down.name, c.down.offset_s) for c in clients[:3]]
    assert clients[0].trace == clients[0].down.name and clients[0].up.bps == 5e6  # up keeps links.up_bps


def test_a_start_exactly_at_a_repetition_counts_the_last_stamp_of_the_previous_one():
    trace = PacketTrace(np.array(TINY))
    # at 100 ms: the 10th repetition's stamp 10 and the 11th's two zeros -> 3 opportunities at 100 ms
    assert trace.delivery_seconds(3 * MTU, 0.100) == 0.0
    assert trace.delivery_seconds(4 * MTU, 0.100) == pytest.approx(0.005, abs=1e-15)


def test_a_bad_trace_file_exits_2_with_one_line_before_any_run_directory(tmp_path, capsys):
    from emulator.__main__ import main

    bad = tmp_path / "bad.down"
    bad.write_text("0\nlots\n")
    code = main([f"links.trace.down=[{bad}]", f"output.dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "links.trace.down[0]" in err and "line 2" in err, err
    assert not (tmp_path / "runs").exists()


def test_the_shipped_csv_examples_parse():
    wifi = read_link_trace(str(SCENARIO_DIR / "traces" / "wifi-steps.csv"))
    assert wifi.period == 60.0 and wifi.per_period == 20e6 * 30 + 4e6 * 15 + 12e6 * 13
    cfg = load("cellular")
    assert build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 0)[0].compute_time(1, 0.0) > 0
