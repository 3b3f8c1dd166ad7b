"""The tests `make test-fast` leaves out (marker `slow`), each with why.

Under each file, a key is a test (every case of it) or `test[case]` (that case only).

`make test` runs everything. `make test-fast` runs the rest: every unit test, and at least one end-to-end
run of each part (a run, a policy's run, the zygote, the evaluator, traces, hooks and TensorBoard, the
analysis, the CLI's summary); docs/development.md says what it leaves out. A test belongs here when it takes
seconds because of what it checks: many runs side by side, a kill and the restart it waits for, a grid over
every policy or key, an install, a measurement over many steps.
"""

from __future__ import annotations

SWEEP = "runs a sweep: several complete runs through a launcher"
KILL = "kills, stalls or interrupts processes and waits out the restart, heartbeat or timeout"
SIDE_BY_SIDE = "compares complete runs side by side (worker counts, overlap, resume, which clients are kept)"
GRID = "runs a grid: every policy, shipped scenario, numeric key, model or documented command"
INSTALL = "builds and installs a wheel"
MEASURE = "measures memory or rates over many steps, frames or draws"
FRESH_INTERPRETER = "starts fresh interpreters to check what gets imported or built there"
PLOTS = "renders every plot, or runs the analysis on a run of its own"
ACCOUNTING = "composes long DP-SGD histories under the PRV or PLD accountant"
MORE_RUNS = "one more complete run of a path another fast test already runs end to end"
SITE = "builds the documentation site, and with it the complete runs its figures are drawn from"

SLOW: dict[str, dict[str, str]] = {  # file -> test -> why
    "tests/unit/test_scale.py": {
        "test_a_million_client_run_holds_objects_only_for_the_clients_it_selected": MEASURE,
        "test_a_million_client_round_of_oort_fedcs_or_udp_crd_is_the_work_of_its_clients": MEASURE,
        "test_a_million_client_round_under_diurnal_availability_asks_no_client_it_does_not_select": MEASURE,
    },
    "tests/e2e/test_analysis.py": {
        "test_summary_matches_the_parquet": PLOTS,
        "test_paper_style_writes_pdf_and_svg_beside_each_png": PLOTS,
        "test_target_accuracy_option_sets_the_target": PLOTS,
        "test_every_figure_and_the_report_are_written": PLOTS,
        "test_accuracy_vs_a_swept_key_is_drawn_only_for_a_sweep_of_numeric_keys": PLOTS,
        "test_accuracy_vs_epsilon_puts_dp_fedavg_beside_dp_sgd_each_labelled_with_unit_and_accountant": SWEEP,
    },
    "tests/e2e/test_bench_rss.py": {
        "test_the_peak_counts_the_server_its_evaluator_and_its_workers": MEASURE,
    },
    "tests/e2e/test_bundle_e2e.py": {
        "test_bundled_runs_give_identical_tables_whatever_the_number_of_workers": SIDE_BY_SIDE,
    },
    "tests/e2e/test_compression_e2e.py": {
        "test_compressed_runs_with_error_feedback_are_the_same_whatever_the_number_of_workers": SIDE_BY_SIDE,
        "test_a_run_with_error_feedback_killed_and_resumed_gives_the_uninterrupted_tables": KILL,
    },
    "tests/e2e/test_doc_figures.py": {
        "test_the_built_site_shows_every_figure_on_its_pages": SITE,
        "test_a_build_with_nothing_changed_runs_nothing_and_rewrites_no_figure": SITE,
    },
    "tests/e2e/test_doc_snippets.py": {
        "test_the_snippet_runs": GRID,
    },
    "tests/e2e/test_dp_fedavg_e2e.py": {
        "test_one_or_two_workers_give_the_same_tables": SIDE_BY_SIDE,
        "test_adaptive_clipping_tracks_the_target_quantile_of_the_update_norms": MEASURE,
    },
    "tests/e2e/test_evaluation_e2e.py": {
        "test_the_last_round_is_evaluated_whatever_stops_the_run": KILL,
        "test_an_interrupt_while_the_next_round_trains_writes_the_round_being_evaluated": KILL,
        "test_resume_after_sigkill_with_overlap_and_eval_every_gives_the_uninterrupted_tables": KILL,
        "test_a_run_killed_before_its_last_round_was_evaluated_gets_it_on_resume": KILL,
        "test_an_evaluator_killed_at_an_evaluation_is_restarted_and_the_tables_are_the_uninterrupted_runs": KILL,
        "test_an_evaluator_out_of_restarts_fails_the_run_after_the_rounds_before_it": KILL,
        "test_tables_and_checkpoints_are_the_same_with_and_without_overlap_and_any_worker_count": SIDE_BY_SIDE,
        "test_every_k_th_round_and_the_last_are_evaluated_and_nothing_else_changes": SIDE_BY_SIDE,
    },
    "tests/e2e/test_evaluator.py": {
        "test_a_restarted_evaluator_must_build_the_first_ones_initial_model": KILL,
        "test_an_evaluator_that_dies_is_restarted_answers_alike_and_its_restarts_are_capped": KILL,
    },
    "tests/e2e/test_faults.py": {
        "test_repeated_crashes_are_capped_and_the_run_fails_clearly": KILL,
        "test_a_worker_stuck_in_training_is_timed_out_and_replaced": KILL,
        "test_a_slot_out_of_restarts_is_retired_and_the_other_workers_finish_the_run": KILL,
        "test_ctrl_c_stops_server_and_workers_and_keeps_completed_rounds": KILL,
        "test_a_remote_worker_that_goes_silent_is_dead_after_missed_heartbeats": KILL,
        "test_an_exception_in_the_server_shuts_every_worker_down": KILL,
        "test_an_evaluator_killed_mid_run_is_restarted_and_the_run_ends_with_the_uninterrupted_tables": KILL,
        "test_an_evaluator_killed_with_no_restarts_allowed_fails_the_run_in_one_line_and_keeps_its_rounds": KILL,
    },
    "tests/e2e/test_golden_results.py": {
        "test_a_run_gives_its_recorded_results": GRID,
    },
    "tests/e2e/test_hooks.py": {
        "test_a_sweeps_points_are_separate_tensorboard_runs_named_by_their_keys": SWEEP,
        "test_a_hook_that_cannot_be_loaded_is_refused_in_one_line_before_anything_runs": MORE_RUNS,
        "test_a_users_hook_sees_every_round_in_order_with_its_evaluation_then_the_end": MORE_RUNS,
    },
    "tests/e2e/test_hostile_wire.py": {
        "test_decoding_any_frames_raises_nothing_but_a_protocol_error": MEASURE,
        "test_oversized_frames_are_dropped_by_the_socket_and_the_servers_memory_stays_flat": MEASURE,
        "test_the_server_counts_any_frames_it_cannot_use_and_never_raises": MEASURE,
    },
    "tests/e2e/test_input_validation.py": {
        "test_every_numeric_key_refuses_nan_inf_negative_and_huge_or_documents_them": GRID,
        "test_the_layer_sizes_are_those_a_forward_pass_gives_for_every_model_and_dataset": GRID,
        "test_a_yaml_bomb_and_deep_nesting_from_the_real_command_line": FRESH_INTERPRETER,
        "test_the_memory_estimate_bounds_each_process_of_a_run_from_above": MEASURE,
        "test_a_soft_open_files_limit_too_low_is_raised_for_the_server_and_its_workers": MORE_RUNS,
    },
    "tests/e2e/test_key_files.py": {
        "test_a_worker_started_before_its_server_waits_for_it_past_the_handshake_bound": KILL,
        "test_a_worker_whose_peer_accepts_but_never_shakes_hands_exits_3_in_bounded_time": KILL,
    },
    "tests/e2e/test_packaging.py": {
        "test_an_installed_wheel_runs_a_shipped_scenario_by_name_from_another_directory": INSTALL,
        "test_the_wheel_ships_every_package_scenario_trace_and_the_console_scripts": INSTALL,
    },
    "tests/e2e/test_partial_work_e2e.py": {
        "test_partial_work_is_the_same_whatever_the_number_of_workers_and_normalises_by_steps": SIDE_BY_SIDE,
    },
    "tests/e2e/test_policies_e2e.py": {
        "test_ali_dpfl_half_the_bytes_lowers_R_s_and_raises_tau": SIDE_BY_SIDE,
        "test_adap_dpfl_sigma_decays_and_ledgers_compose_it": MORE_RUNS,
        "test_padpfl_noise_and_impact_factors_per_round": MORE_RUNS,
    },
    "tests/e2e/test_policy_grid.py": {
        "test_every_policy_runs_two_rounds": GRID,
        "test_every_policy_plans_on_every_shipped_scenario": GRID,
    },
    "tests/e2e/test_ray_multinode.py": {
        "test_workers_spread_over_two_nodes_give_the_tables_of_local_workers": SIDE_BY_SIDE,
        "test_a_node_lost_mid_run_restarts_its_worker_on_the_node_left": KILL,
    },
    "tests/e2e/test_ray_launcher.py": {
        "test_workers_started_by_ray_give_the_tables_of_local_workers": SIDE_BY_SIDE,
        "test_sigterm_stops_the_run_and_kills_the_ray_workers": KILL,
        "test_a_dead_ray_actor_costs_its_task_and_its_slot_is_restarted": KILL,
    },
    "tests/e2e/test_reproduce_rerun.py": {
        "test_a_changed_point_is_rerun_and_the_earlier_run_is_kept": SWEEP,
    },
    "tests/e2e/test_rejections.py": {
        "test_a_nan_checkpoint_falls_back_to_the_previous_one_at_once": KILL,
        "test_with_both_checkpoints_nan_resume_is_one_line_exit_2": KILL,
        "test_a_nan_model_every_worker_rejects_stops_the_run_in_one_line_blaming_no_worker": KILL,
        "test_a_sigkilled_servers_private_directory_is_swept_at_the_next_start_and_no_live_ones": KILL,
    },
    "tests/e2e/test_resume.py": {
        "test_resume_after_sigkill_gives_the_uninterrupted_tables": KILL,
        "test_a_run_killed_during_start_up_resumes_from_round_0": KILL,
        "test_a_run_killed_during_round_0s_writes_resumes_from_round_0": KILL,
        "test_a_damaged_checkpoint_falls_back_to_the_previous_one": SIDE_BY_SIDE,
        "test_a_checkpoint_that_does_not_fit_the_run_falls_back_to_the_previous_one": GRID,
        "test_with_neither_checkpoint_fitting_resume_is_one_line_and_changes_nothing": GRID,
    },
    "tests/e2e/test_run_dir.py": {
        "test_a_second_resume_of_the_same_run_is_refused_while_the_first_runs": KILL,
        "test_two_runs_with_the_same_name_started_together_one_is_refused": KILL,
    },
    "tests/e2e/test_run_summary.py": {
        "test_a_worker_waiting_for_a_server_that_is_not_there_says_so_periodically": KILL,
        "test_a_hand_started_worker_says_what_it_does_and_run_json_lists_it": MORE_RUNS,
        "test_client_level_output_noise_is_labelled_so_with_its_delta": MORE_RUNS,
    },
    "tests/e2e/test_runtime.py": {
        "test_a_worker_killed_mid_round_costs_its_update_and_the_run_goes_on": KILL,
        "test_same_seed_gives_identical_tables_whatever_the_number_of_workers": SIDE_BY_SIDE,
        "test_bernoulli_loss_rate_lands_in_the_99_percent_binomial_interval": MEASURE,
        "test_a_data_quality_swap_at_a_given_round_is_recorded_and_applied": MORE_RUNS,
        "test_a_worker_started_by_hand_joins_over_tcp": MORE_RUNS,
        "test_byte_budget_stops_the_run_without_being_exceeded": MORE_RUNS,
        "test_parquet_bytes_equal_the_frames_the_workers_received_and_sent": MORE_RUNS,
        "test_each_worker_starts_a_round_with_a_client_it_trained_last": MORE_RUNS,
        "test_all_uploads_lost_aggregates_nothing_and_keeps_the_global_model": MORE_RUNS,
        "test_time_budget_stops_the_run_without_being_exceeded": MORE_RUNS,
        "test_a_client_too_slow_for_the_deadline_is_late_and_not_aggregated": MORE_RUNS,
        "test_epsilon_matches_opacus_and_never_exceeds_the_target": MORE_RUNS,
    },
    "tests/e2e/test_security.py": {
        "test_ten_thousand_malformed_messages_change_nothing_but_the_counters": MEASURE,
        "test_curve_admits_workers_with_an_authorized_key_only": MORE_RUNS,
    },
    "tests/e2e/test_signals.py": {
        "test_sigterm_stops_the_run_like_ctrl_c": KILL,
    },
    "tests/e2e/test_startup.py": {
        "test_results_do_not_depend_on_which_built_clients_the_workers_keep": SIDE_BY_SIDE,
        "test_a_local_workers_initial_model_unlike_the_servers_fails_the_run_before_any_row": SIDE_BY_SIDE,
        "test_the_server_imports_no_opacus_no_torch_and_builds_no_client": FRESH_INTERPRETER,
        "test_a_worker_sets_up_and_trains_deterministically_without_importing_torchs_compiler": FRESH_INTERPRETER,
        "test_the_workers_are_started_before_the_server_loads_its_data": FRESH_INTERPRETER,
    },
    "tests/e2e/test_sweep.py": {
        "test_a_ray_sweep_gives_the_tables_of_the_points_run_one_by_one": SWEEP,
        "test_a_submitit_sweep_gives_the_tables_of_the_points_run_one_by_one": SWEEP,
        "test_an_interrupted_point_is_resumed_and_an_outdated_one_kept_aside": SWEEP,
        "test_rerun_runs_nothing_new_then_only_the_deleted_run": SWEEP,
        "test_the_joblib_sweep_gives_the_tables_of_the_points_run_one_by_one": SWEEP,
        "test_a_changed_override_re_runs_every_point_and_sweep_json_keeps_the_earlier_records": SWEEP,
        "test_failed_run_is_recorded_and_rerun_retries_only_it": SWEEP,
        "test_a_point_stopped_by_ctrl_c_or_sigterm_is_interrupted_not_failed": SWEEP,
        "test_sweep_writes_one_hive_partitioned_directory": SWEEP,
        "test_multirun_flag_may_come_anywhere_among_the_overrides": SWEEP,
    },
    "tests/e2e/test_traces_e2e.py": {
        "test_traces_give_identical_tables_whatever_the_number_of_workers": SIDE_BY_SIDE,
        "test_on_cellular_links_fedcs_loses_fewer_updates_to_the_deadline_than_random_selection": SIDE_BY_SIDE,
        "test_resume_refuses_a_trace_file_changed_since_the_run_started": SIDE_BY_SIDE,
        "test_excluded_clients_are_never_selected": MORE_RUNS,
    },
    "tests/e2e/test_user_policy.py": {
        "test_a_policy_that_cannot_be_loaded_is_one_line_exit_2": MORE_RUNS,
    },
    "tests/e2e/test_zygote.py": {
        "test_a_forked_worker_that_dies_is_seen_with_its_signal_and_restarted_as_a_process_of_its_own": KILL,
        "test_two_threads_watching_one_zygotes_children_see_every_pid_and_exit_status": KILL,
        "test_the_cli_prestarts_one_zygote_for_a_run_and_ends_it_if_unused": KILL,
        "test_a_zygote_prestarted_under_another_environment_is_ended_unused": KILL,
        "test_a_prestarted_zygote_forks_the_pools_workers": MORE_RUNS,
    },
    "tests/unit/test_bench_accountants.py": {
        "test_table_has_a_timed_row_per_accountant": MEASURE,
    },
    "tests/unit/test_config.py": {
        "test_every_shipped_scenario_validates_and_its_plain_data_is_omegaconfs": GRID,
    },
    "tests/unit/test_dp_fedavg.py": {
        "test_a_cross_device_population_is_the_librarys_epsilon[prv]": ACCOUNTING,
        "test_a_cross_device_population_is_the_librarys_epsilon[pld]": ACCOUNTING,
    },
    "tests/unit/test_dp_step.py": {
        "test_the_bk_path_trains_without_importing_opacus_or_torchs_compiler": FRESH_INTERPRETER,
    },
    "tests/unit/test_malloc.py": {
        "test_a_trainer_and_the_evaluator_serve_large_blocks_from_the_heap_and_keep_them": MEASURE,
    },
    "tests/unit/test_models.py": {
        "test_build_model_identical_in_another_process": FRESH_INTERPRETER,
        "test_the_evaluation_batch_changes_neither_accuracy_nor_loss_beyond_rounding[cnn_fedavg]": MEASURE,
    },
    "tests/unit/test_privacy.py": {
        "test_improved_matches_opacus_accountant": MEASURE,
        "test_max_steps_is_exact_under_each_accountant": ACCOUNTING,
        "test_prv_and_pld_are_below_rdp_and_compose_runs_as_their_libraries_do[pld]": ACCOUNTING,
        "test_prv_keeps_the_server_free_of_torch_and_opacus": FRESH_INTERPRETER,
    },
    "tests/unit/test_reproduction.py": {
        "test_fashion_mnist_statistics_are_those_of_its_training_set": MEASURE,
    },
}
