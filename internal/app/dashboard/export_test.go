package dashboard

// GraphSVG draws a service graph, for the browser test's synthetic graphs.
var GraphSVG = graphSVG
