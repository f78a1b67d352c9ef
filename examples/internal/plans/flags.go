package plans

import (
	"flag"
	"fmt"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/examples/internal/cli"
)

// FlagsSynopsis is the part of a command's synopsis that Flags defines.
const FlagsSynopsis = "[-quota calls] [-burst calls] [-pro-quota calls] [-pro-burst calls] [-enterprise-burst calls] [-prefix name]"

// Flags defines the price list's flags on fs (-quota, -burst, -pro-quota,
// -pro-burst, -enterprise-burst) and -prefix, the counter prefix; after
// fs is parsed, the returned func gives their values.
func Flags(fs *flag.FlagSet) func() (Tiers, string) {
	quota := cli.Int64(fs, "quota", 1000, 1, ratekit.MaxQuota, "`calls` per API key and billing month on the free plan")
	burst := cli.Int64(fs, "burst", 2, 1, ratekit.MaxQuota, "`calls` per API key and second on the free plan")
	proQuota := cli.Int64(fs, "pro-quota", 100_000, 1, ratekit.MaxQuota, "`calls` per API key and billing month on the pro plan")
	proBurst := cli.Int64(fs, "pro-burst", 10, 1, ratekit.MaxQuota, "`calls` per API key and second on the pro plan")
	entBurst := cli.Int64(fs, "enterprise-burst", 50, 1, ratekit.MaxQuota, "`calls` per API key and second on the enterprise plan (its monthly quota is per customer)")
	prefix := cli.String(fs, "prefix", DefaultPrefix, "counter prefix in the shared ratekit tables: a `name` of letters, digits, '-', '_', '.' and ':'", func(v string) error {
		if len(v) > MaxPrefixLen {
			return fmt.Errorf("must be at most %d bytes", MaxPrefixLen)
		}
		return ratekit.ValidatePolicyName(v)
	})
	return func() (Tiers, string) {
		return Tiers{Free: Tier{Burst: *burst, Quota: *quota}, Pro: Tier{Burst: *proBurst, Quota: *proQuota}, EnterpriseBurst: *entBurst}, *prefix
	}
}

// Describe returns t as a log line's attributes.
func (t Tiers) Describe() []any {
	return []any{"free", fmt.Sprintf("%d/s, %d/month", t.Free.Burst, t.Free.Quota), "pro", fmt.Sprintf("%d/s, %d/month", t.Pro.Burst, t.Pro.Quota),
		"enterprise", fmt.Sprintf("%d/s, per customer", t.EnterpriseBurst)}
}
