"""Fuzz suite: every parser of ddpdoctor fed structurally mutated input; the property is always the same: a result
or BadInput (one line), never a traceback. DDPDOCTOR_FUZZ_EXAMPLES sets the cases per parser (default 25)."""
