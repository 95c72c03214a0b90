"""ddpdoctor's own TensorBoard tab: run directories under the log dir, their reports and an all-ranks timeline."""
