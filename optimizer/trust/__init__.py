"""Can this judge be trusted: the self-test (`selftest`: A/A and planted edits through the loop's own
decision), the certificate (`certify`: agreement, test-retest, transfer, confirmations) and the bias
battery (`bias`). They read the ledger and the cache and run dev splits only."""
